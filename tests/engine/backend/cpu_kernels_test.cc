// Every entry of the AVX2 kernel table against its scalar twin (and both against double-precision
// references where the result is not exact), on random data with SIMD tails: lengths that are
// not multiples of 8/16/32, every tile shape, NaN/inf/tie inputs for the conversions.
//
// Tolerances: conversions and quantization must be bit-exact (same rounding rule). Dots are
// compared to a double reference with |err| <= 8 * sqrt(k) * 2^-24 * sum|w_i x_i|: both kernels
// sum k F32 terms in different orders, whose rounding error grows like sqrt(k) ulps of the
// absolute sum for random data; one dropped or doubled term (~sum/k) still fails for every k
// tested. Elementwise results with exp are held to 1e-6 relative (~8 ulps: the AVX2 exp is
// within 2 ulps, plus division and product).
#include <cpuid.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "engine/backend/cpu/kernels.h"
#include "engine/backend/kv_rotation.h"
#include "engine/quant/fp16.h"
#include "engine/quant/k_quants.h"
#include "engine/quant/q4_kx16.h"
#include "engine/quant/q5_0x16.h"
#include "engine/quant/q6_kx16.h"
#include "engine/quant/q8_0.h"
#include "engine/quant/q8_0x16.h"

namespace pd::engine::cpu {
namespace {

const std::vector<int64_t> kLengths = {0,  1,  3,  7,  8,  9,  15,  16,   17,
                                       31, 32, 33, 63, 64, 65, 100, 1000, 4099};

class KernelsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    avx2_ = Avx2Kernels();
    if (avx2_ == nullptr || &SelectKernels(false) != avx2_) {
      GTEST_SKIP() << "AVX2 kernels not available on this build/CPU";
    }
  }
  const Kernels& s_ = ScalarKernels();
  const Kernels* avx2_ = nullptr;
  std::mt19937 rng_{1234};

  std::vector<float> Random(int64_t n, float scale = 1.f) {
    std::normal_distribution<float> d(0.f, scale);
    std::vector<float> v(n);
    for (float& x : v) x = d(rng_);
    return v;
  }
};

TEST(KernelsSelectTest, ForceScalarAndNames) {
  EXPECT_EQ(&SelectKernels(true), &ScalarKernels());
  EXPECT_STREQ(ScalarKernels().name, "scalar");
  if (Avx2Kernels() != nullptr) {
    EXPECT_STREQ(Avx2Kernels()->name, "avx2");
  }
#if defined(__x86_64__)
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
      __builtin_cpu_supports("f16c")) {
    ASSERT_NE(Avx2Kernels(), nullptr);
    EXPECT_EQ(&SelectKernels(false), Avx2Kernels());
  }
#endif
}

TEST_F(KernelsTest, F16ConversionsBitExact) {
  // Every half, widened and narrowed back.
  std::vector<uint16_t> h(65536 + 5);
  for (size_t i = 0; i < h.size(); ++i) h[i] = static_cast<uint16_t>(i * 40503u);  // odd tail
  for (int i = 0; i < 65536; ++i) h[i] = static_cast<uint16_t>(i);
  std::vector<float> fs(h.size()), fa(h.size());
  s_.f16_to_f32(h.data(), fs.data(), h.size());
  avx2_->f16_to_f32(h.data(), fa.data(), h.size());
  for (size_t i = 0; i < h.size(); ++i) {
    if (std::isnan(fs[i])) {
      ASSERT_TRUE(std::isnan(fa[i])) << i;
    } else {
      ASSERT_EQ(BitsFromFp32(fs[i]), BitsFromFp32(fa[i])) << "h=" << h[i];
    }
  }
  // Narrowing: every half value, midpoints between neighbours, random floats of all magnitudes.
  std::vector<float> x(fs.begin(), fs.end());
  std::uniform_int_distribution<uint32_t> bits;
  for (int i = 0; i < 65535; ++i) x.push_back((F16ToF32(i) + F16ToF32(i + 1)) / 2);
  for (int i = 0; i < 100000; ++i) x.push_back(Fp32FromBits(bits(rng_)));
  x.push_back(1.f);  // odd length
  for (int64_t n : {static_cast<int64_t>(x.size()), int64_t{13}}) {
    std::vector<uint16_t> ys(n), ya(n);
    s_.f32_to_f16(x.data(), ys.data(), n);
    avx2_->f32_to_f16(x.data(), ya.data(), n);
    for (int64_t i = 0; i < n; ++i) {
      if (std::isnan(x[i])) {
        ASSERT_TRUE(std::isnan(F16ToF32(ya[i]))) << i;
      } else {
        ASSERT_EQ(ys[i], ya[i]) << "x=" << x[i] << " bits " << BitsFromFp32(x[i]);
      }
    }
  }
}

TEST_F(KernelsTest, Bf16ConversionsBitExact) {
  std::vector<uint16_t> h(65536 + 7);
  for (size_t i = 0; i < h.size(); ++i) h[i] = static_cast<uint16_t>(i);
  std::vector<float> fs(h.size()), fa(h.size());
  s_.bf16_to_f32(h.data(), fs.data(), h.size());
  avx2_->bf16_to_f32(h.data(), fa.data(), h.size());
  for (size_t i = 0; i < h.size(); ++i) ASSERT_EQ(BitsFromFp32(fs[i]), BitsFromFp32(fa[i])) << i;
  // Narrowing, NaN included (both quiet it the same way): random bit patterns and exact ties.
  std::vector<float> x(fs.begin(), fs.end());
  std::uniform_int_distribution<uint32_t> bits;
  for (int i = 0; i < 200000; ++i) x.push_back(Fp32FromBits(bits(rng_)));
  for (uint32_t b = 0; b < 65536; b += 3) x.push_back(Fp32FromBits((b << 16) | 0x8000u));
  x.push_back(Fp32FromBits(0x7f800001u));  // signalling NaN
  x.push_back(Fp32FromBits(0xffffffffu));
  for (int64_t n : {static_cast<int64_t>(x.size()), int64_t{15}, int64_t{17}}) {
    std::vector<uint16_t> ys(n), ya(n);
    s_.f32_to_bf16(x.data(), ys.data(), n);
    avx2_->f32_to_bf16(x.data(), ya.data(), n);
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(ys[i], ya[i]) << "bits " << BitsFromFp32(x[i]);
  }
}

TEST_F(KernelsTest, Q8_0QuantizeBitExact) {
  const int kBlocks = 3000;
  std::vector<float> x;
  std::uniform_real_distribution<float> log_scale(-30.f, 30.f);
  for (int b = 0; b < kBlocks; ++b) {
    std::vector<float> v = Random(32, std::exp2(log_scale(rng_)));
    if (b % 3 == 0) {
      // Ties: amax 127 makes id = 1, so k + 0.5 lands exactly halfway.
      v[0] = 127.f;
      for (int j = 1; j < 32; ++j) v[j] = std::round(v[j] * 10.f) + (j % 2 ? 0.5f : -0.5f);
      for (int j = 1; j < 32; ++j) v[j] = std::max(-126.5f, std::min(126.5f, v[j]));
    }
    if (b % 7 == 0) std::fill(v.begin(), v.end(), 0.f);
    if (b % 11 == 0) v[5] = -0.f;
    x.insert(x.end(), v.begin(), v.end());
  }
  std::vector<BlockQ8_0> qs(kBlocks), qa(kBlocks);
  s_.quantize_q8_0(x.data(), qs.data(), x.size());
  avx2_->quantize_q8_0(x.data(), qa.data(), x.size());
  ASSERT_EQ(std::memcmp(qs.data(), qa.data(), qs.size() * sizeof(BlockQ8_0)), 0);
  for (int b = 0; b < kBlocks; ++b) {
    ASSERT_EQ(qs[b].d, qa[b].d) << b;
    for (int j = 0; j < 32; ++j) ASSERT_EQ(qs[b].qs[j], qa[b].qs[j]) << b << "," << j;
  }
  // The scalar reference must itself round ties to even, as ggml-cpu's x86 quantize_row_q8_0 does
  // for activations (it rounded half away from zero, like the weight quantizer, before): block 3
  // is a tie block (d = 1).
  ASSERT_EQ(qs[3].d, 0x3c00);
  for (int j = 1; j < 32; ++j) {
    ASSERT_EQ(std::fabs(x[3 * 32 + j] - std::trunc(x[3 * 32 + j])), 0.5f);
    EXPECT_EQ(qs[3].qs[j], static_cast<int8_t>(std::nearbyint(x[3 * 32 + j]))) << j;
  }
  std::vector<float> ds(x.size()), da(x.size());
  s_.dequantize_q8_0(qs.data(), ds.data(), x.size());
  avx2_->dequantize_q8_0(qs.data(), da.data(), x.size());
  ASSERT_EQ(std::memcmp(ds.data(), da.data(), ds.size() * sizeof(float)), 0);
}

// Converted rows of one type, plus their exact values as doubles.
struct Rows {
  std::vector<char> bytes;
  std::vector<double> values;  // [rows, k]
  size_t stride = 0;
};

Rows MakeRows(GemmType type, const std::vector<float>& src, int rows, int64_t k) {
  Rows r;
  const Kernels& s = ScalarKernels();
  r.stride = type == GemmType::kF32    ? k * 4
             : type == GemmType::kQ8_0 ? k / 32 * sizeof(BlockQ8_0)
                                       : k * 2;
  r.bytes.resize(r.stride * rows + 64);
  r.values.resize(rows * k);
  std::vector<float> tmp(k);
  for (int i = 0; i < rows; ++i) {
    const float* x = src.data() + i * k;
    char* dst = r.bytes.data() + i * r.stride;
    switch (type) {
      case GemmType::kF32:
        std::memcpy(dst, x, k * 4);
        std::copy(x, x + k, tmp.begin());
        break;
      case GemmType::kF16:
        s.f32_to_f16(x, reinterpret_cast<uint16_t*>(dst), k);
        s.f16_to_f32(reinterpret_cast<uint16_t*>(dst), tmp.data(), k);
        break;
      case GemmType::kBF16:
        s.f32_to_bf16(x, reinterpret_cast<uint16_t*>(dst), k);
        s.bf16_to_f32(reinterpret_cast<uint16_t*>(dst), tmp.data(), k);
        break;
      case GemmType::kQ8_0:
        s.quantize_q8_0(x, reinterpret_cast<BlockQ8_0*>(dst), k);
        s.dequantize_q8_0(reinterpret_cast<BlockQ8_0*>(dst), tmp.data(), k);
        break;
      case GemmType::kQ4_0:  // weight and activation types differ: k_quant_kernels_test.cc
      case GemmType::kQ5_0:
      case GemmType::kQ2_K:
      case GemmType::kQ3_K:
      case GemmType::kQ4_K:
      case GemmType::kQ5_K:
      case GemmType::kQ6_K:
      case GemmType::kW8A8:  // pd_format_kernels_test.cc
      case GemmType::kW4A16:
        ADD_FAILURE() << "MakeRows handles the same-type tiles only";
        break;
    }
    for (int64_t j = 0; j < k; ++j) r.values[i * k + j] = tmp[j];
  }
  return r;
}

TEST_F(KernelsTest, GemmTilesAllShapesMatchReference) {
  // The tiles whose weights and activations share a type; Q4_0 and the k-quants are checked in
  // k_quant_kernels_test.cc.
  for (int t = 0; t <= static_cast<int>(GemmType::kQ8_0); ++t) {
    const GemmType type = static_cast<GemmType>(t);
    const std::vector<int64_t> ks = type == GemmType::kQ8_0
                                        ? std::vector<int64_t>{32, 64, 96, 160, 4096}
                                        : std::vector<int64_t>{1, 7, 8, 9, 16, 33, 100, 257, 4099};
    for (int64_t k : ks) {
      std::vector<float> wf = Random(kGemmTileW * k), xf = Random(kGemmTileX * k);
      // Outliers so that Q8_0 scales differ per block.
      for (int64_t i = 0; i < static_cast<int64_t>(wf.size()); i += 37) wf[i] *= 8.f;
      const Rows w = MakeRows(type, wf, kGemmTileW, k);
      const Rows x = MakeRows(type, xf, kGemmTileX, k);
      for (int nr = 1; nr <= kGemmTileW; ++nr) {
        for (int nc = 1; nc <= kGemmTileX; ++nc) {
          const int64_t ys = 7;  // y stride larger than the tile
          std::vector<float> ya(nc * ys, -999.f), yb(nc * ys, -999.f);
          s_.gemm[t](k, w.bytes.data(), w.stride, nr, x.bytes.data(), x.stride, nc, ya.data(), ys);
          avx2_->gemm[t](k, w.bytes.data(), w.stride, nr, x.bytes.data(), x.stride, nc, yb.data(),
                         ys);
          for (int c = 0; c < nc; ++c) {
            for (int r = 0; r < ys; ++r) {
              if (r >= nr) {  // outside the tile: untouched
                ASSERT_EQ(ya[c * ys + r], -999.f);
                ASSERT_EQ(yb[c * ys + r], -999.f);
                continue;
              }
              double ref = 0, abs_sum = 0;
              for (int64_t j = 0; j < k; ++j) {
                const double p = w.values[r * k + j] * x.values[c * k + j];
                ref += p;
                abs_sum += std::fabs(p);
              }
              const double tol = 8 * std::sqrt(double(k)) * 0x1p-24 * abs_sum + 1e-30;
              ASSERT_NEAR(ya[c * ys + r], ref, tol)
                  << "scalar type " << t << " k " << k << " tile " << nr << "x" << nc;
              ASSERT_NEAR(yb[c * ys + r], ref, tol)
                  << "avx2 type " << t << " k " << k << " tile " << nr << "x" << nc;
            }
          }
        }
      }
    }
  }
}

TEST_F(KernelsTest, Q8_0DotHandlesMinus128Weights) {
  // Files may hold -128 (our quantizer never writes it); maddubs on |w| = 128 must not saturate.
  std::vector<BlockQ8_0> w(2), x(2);
  for (int b = 0; b < 2; ++b) {
    w[b].d = 0x3c00;
    x[b].d = 0x3c00;
    for (int j = 0; j < 32; ++j) {
      w[b].qs[j] = -128;
      x[b].qs[j] = (j % 2) ? 127 : -127;
    }
    x[b].qs[0] = 127;
  }
  float ys = 0, ya = 0;
  s_.gemm[3](64, w.data(), 0, 1, x.data(), 0, 1, &ys, 1);
  avx2_->gemm[3](64, w.data(), 0, 1, x.data(), 0, 1, &ya, 1);
  const float want = 2 * (-128.f * 127.f * 2);  // per block: 17 * 127 - 15 * 127 = 2 * 127
  EXPECT_EQ(ys, want);
  EXPECT_EQ(ya, want);
}

// Random blocks for the VNNI tests: weight codes over their whole range (Q8_0: -128 included),
// activations in [-127, 127] as the activation quantizer writes them, f16 scales in [2^-13, 2].
template <typename W>
std::vector<W> RandomWeightBlocks(std::mt19937& rng, size_t count) {
  std::uniform_int_distribution<int> byte(0, 255), scale(0x2000, 0x4000);
  std::vector<W> v(count);
  for (W& b : v) {
    b.d = static_cast<uint16_t>(scale(rng));
    if constexpr (std::is_same_v<W, BlockQ8_0>) {
      for (int8_t& q : b.qs) q = static_cast<int8_t>(byte(rng) - 128);
    } else if constexpr (std::is_same_v<W, BlockQ4_0>) {
      for (uint8_t& q : b.qs) q = static_cast<uint8_t>(byte(rng));
    } else {
      for (uint8_t& q : b.qh) q = static_cast<uint8_t>(byte(rng));
      for (uint8_t& q : b.qs) q = static_cast<uint8_t>(byte(rng));
    }
  }
  return v;
}
std::vector<BlockQ8_0> RandomActivationBlocks(std::mt19937& rng, size_t count) {
  std::uniform_int_distribution<int> xcode(-127, 127), scale(0x2000, 0x4000);
  std::vector<BlockQ8_0> v(count);
  for (BlockQ8_0& b : v) {
    b.d = static_cast<uint16_t>(scale(rng));
    for (int8_t& q : b.qs) q = static_cast<int8_t>(xcode(rng));
  }
  return v;
}

// A VNNI tile against the AVX2 one, bit for bit, at every tile shape: 4 weight rows and 4
// activation rows of k values.
template <typename W>
void ExpectTileBitsEqual(GemmTileFn vnni, GemmTileFn avx2, uint32_t seed,
                         std::initializer_list<int64_t> ks) {
  std::mt19937 rng(seed);
  for (int64_t k : ks) {
    const int64_t nb = k / 32;
    const std::vector<W> w = RandomWeightBlocks<W>(rng, 4 * nb);
    const std::vector<BlockQ8_0> x = RandomActivationBlocks(rng, 4 * nb);
    const size_t ws = nb * sizeof(W), xs = nb * sizeof(BlockQ8_0);
    for (int nr = 1; nr <= kGemmTileW; ++nr) {
      for (int nc = 1; nc <= kGemmTileX; ++nc) {
        float ya[16], yv[16];
        avx2(k, w.data(), ws, nr, x.data(), xs, nc, ya, 4);
        vnni(k, w.data(), ws, nr, x.data(), xs, nc, yv, 4);
        for (int c = 0; c < nc; ++c) {
          for (int r = 0; r < nr; ++r) {
            EXPECT_EQ(std::bit_cast<uint32_t>(ya[c * 4 + r]), std::bit_cast<uint32_t>(yv[c * 4 + r]))
                << "k " << k << " tile " << nr << "x" << nc << " at " << r << "," << c;
          }
        }
      }
    }
  }
}

// The AVX512-VNNI Q8_0 tile gives the AVX2 tile's bits (same int32 lanes, same F32 order).
TEST(Q8_0VnniTest, BitIdenticalToTheAvx2Tile) {
  const GemmTileFn vnni = Q8_0TileVnni();
  if (vnni == nullptr || Avx2Kernels() == nullptr) {
    GTEST_SKIP() << "no AVX512-VNNI on this CPU (or PDSERVE_CPU_ISA / PDSERVE_CPU_NO_VNNI turn it off)";
  }
  ExpectTileBitsEqual<BlockQ8_0>(vnni, &GemmQ8_0Avx2, 5, {32, 640, 4096});
}

// The AVX512-VNNI Q5_0 tile gives the AVX2 tile's bits, four-block steps and leftover blocks
// alike (k = 160 and 4128 leave one over).
TEST(Q5_0VnniTest, BitIdenticalToTheAvx2Tile) {
  const GemmTileFn vnni = Q5_0TileVnni();
  if (vnni == nullptr || Avx2Kernels() == nullptr) {
    GTEST_SKIP() << "no AVX512-VNNI on this CPU (or PDSERVE_CPU_ISA / PDSERVE_CPU_NO_VNNI turn it off)";
  }
  ExpectTileBitsEqual<BlockQ5_0>(vnni, &GemmQ5_0Avx2, 9, {32, 160, 640, 4128});
}

// The AVX512-VNNI Q4_0 tile gives the AVX2 tile's bits (whose lanes are re-ordered into ggml's
// layout, and the VNNI tile's are in it from the start), with leftover blocks.
TEST(Q4_0VnniTest, BitIdenticalToTheAvx2Tile) {
  const GemmTileFn vnni = Q4_0TileVnni();
  if (vnni == nullptr || Avx2Kernels() == nullptr) {
    GTEST_SKIP() << "no AVX512-VNNI on this CPU (or PDSERVE_CPU_ISA / PDSERVE_CPU_NO_VNNI turn it off)";
  }
  ExpectTileBitsEqual<BlockQ4_0>(vnni, &GemmQ4_0Avx2, 10, {32, 160, 640, 4128});
}

// Weight i (0..31) of a 32-block as a signed integer: Q8_0's byte, Q5_0's and Q4_0's codes (low
// nibbles are weights 0..15, high nibbles 16..31; Q5_0's fifth bit is bit i of qh) less their
// offset.
int WeightCode(const BlockQ8_0& b, int i) { return b.qs[i]; }
int WeightCode(const BlockQ5_0& b, int i) {
  const int nibble = i < 16 ? b.qs[i] & 0x0F : b.qs[i - 16] >> 4;
  return (nibble | ((b.qh[i / 8] >> (i % 8)) & 1) << 4) - 16;
}
int WeightCode(const BlockQ4_0& b, int i) {
  return (i < 16 ? b.qs[i] & 0x0F : b.qs[i - 16] >> 4) - 8;
}

// ggml's x86 (AVX2) order for a 32-block format x Q8_0, written out in scalar code: per block,
// eight int32 lanes (lane j: weights 4j..4j+3, exact), each converted to F32 and added into its
// own F32 lane as fma(d_w * d_x, lane, acc); at the end the lanes are summed as
// ((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7)). A GemmTileFn, so that tiles compare to it.
template <typename W>
void GgmlX86Tile(int64_t k, const void* w, size_t ws, int nr, const void* x, size_t xs, int nc,
                 float* y, int64_t ys) {
  const int64_t nb = k / 32;
  for (int r = 0; r < nr; ++r) {
    const W* wr = reinterpret_cast<const W*>(static_cast<const char*>(w) + r * ws);
    for (int c = 0; c < nc; ++c) {
      const BlockQ8_0* xc =
          reinterpret_cast<const BlockQ8_0*>(static_cast<const char*>(x) + c * xs);
      float acc[8] = {};
      for (int64_t b = 0; b < nb; ++b) {
        const float d = F16ToF32(wr[b].d) * F16ToF32(xc[b].d);
        for (int j = 0; j < 8; ++j) {
          int32_t lane = 0;
          for (int i = 4 * j; i < 4 * j + 4; ++i) lane += WeightCode(wr[b], i) * xc[b].qs[i];
          acc[j] = std::fma(d, static_cast<float>(lane), acc[j]);
        }
      }
      y[c * ys + r] =
          ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
    }
  }
}

// The AVX2 Q8_0, Q5_0 and Q4_0 tiles give ggml's x86 order bit for bit on every tile shape, on
// any x86 CPU (the VNNI tests above need AVX512-VNNI; this one holds the AVX2 tiles alone to
// llama.cpp's bits): one block, leftover blocks after four-block steps, the default model's rows.
TEST(Avx2Q0TilesTest, GiveGgmlsX86OrderBitForBit) {
  if (Avx2Kernels() == nullptr) GTEST_SKIP() << "AVX2 kernels not available on this build/CPU";
  ExpectTileBitsEqual<BlockQ8_0>(&GgmlX86Tile<BlockQ8_0>, &GemmQ8_0Avx2, 31, {32, 96, 640, 4096});
  ExpectTileBitsEqual<BlockQ5_0>(&GgmlX86Tile<BlockQ5_0>, &GemmQ5_0Avx2, 32, {32, 160, 640, 4128});
  ExpectTileBitsEqual<BlockQ4_0>(&GgmlX86Tile<BlockQ4_0>, &GemmQ4_0Avx2, 33, {32, 160, 640, 4128});
}

// The grouped 512-bit kernels (16 activation rows per register) give the AVX2 tiles' bits for
// Q8_0 and Q5_0 weights (and so the decode path's: a sequence's logits do not depend on its
// batch): odd and even row counts (the 2-row steps and the tail), activation counts that fill one
// group, part of one, and several, and k with one or many blocks.
template <typename W>
void ExpectGroupedEqualsTiles(const GroupedKernels* g, GemmTileFn tiles, uint32_t seed,
                              std::initializer_list<int64_t> ns = {4, 7, 16, 17, 40},
                              std::initializer_list<int64_t> row_counts = {1, 3, 4, 9},
                              std::initializer_list<int64_t> ks = {32, 640, 2048}) {
  std::mt19937 rng(seed);
  for (int64_t k : ks) {
    const int64_t nb = k / 32;
    for (int64_t rows : row_counts) {
      for (int64_t n : ns) {
        const std::vector<W> w = RandomWeightBlocks<W>(rng, rows * nb);
        const std::vector<BlockQ8_0> x = RandomActivationBlocks(rng, n * nb);
        const size_t ws = nb * sizeof(W), xs = nb * sizeof(BlockQ8_0);
        std::vector<float> want(n * rows), got(n * rows, -1.f);
        for (int64_t c = 0; c < n; c += kGemmTileX) {
          for (int64_t r = 0; r < rows; r += kGemmTileW) {
            tiles(k, reinterpret_cast<const char*>(w.data()) + r * ws, ws,
                  static_cast<int>(std::min<int64_t>(kGemmTileW, rows - r)),
                  reinterpret_cast<const char*>(x.data()) + c * xs, xs,
                  static_cast<int>(std::min<int64_t>(kGemmTileX, n - c)),
                  want.data() + c * rows + r, rows);
          }
        }
        std::vector<char> xp(g->x_bytes(n, k) + 64);
        char* xa = xp.data() + (64 - reinterpret_cast<uintptr_t>(xp.data()) % 64) % 64;
        g->pack_x(x.data(), xs, n, k, xa);
        if (g->pack_w == nullptr) {  // the blocks in place
          g->gemm(k, w.data(), ws, rows, xa, n, got.data(), rows);
        } else {
          std::vector<char> wp(g->w_bytes(rows, k));
          g->pack_w(w.data(), ws, rows, k, wp.data());
          g->gemm(k, wp.data(), 0, rows, xa, n, got.data(), rows);
        }
        for (int64_t c = 0; c < n; ++c) {
          for (int64_t r = 0; r < rows; ++r) {
            ASSERT_EQ(std::bit_cast<uint32_t>(want[c * rows + r]),
                      std::bit_cast<uint32_t>(got[c * rows + r]))
                << "k " << k << " rows " << rows << " n " << n << " at " << r << "," << c << ": "
                << want[c * rows + r] << " vs " << got[c * rows + r];
          }
        }
      }
    }
  }
}

// The VNNI grouped kernels run rows longer than 24 blocks in spans over tiles of 8 weight rows,
// carrying the accumulators: k = 800 (a span of 24 blocks and one of 1) and 2,048 (24, 24, 16),
// 9 rows (a tile and a one-row tile).
TEST(GroupedVnniTest, Q8_0BitIdenticalToTheAvx2Tiles) {
  const GroupedKernels* g = Q8_0GroupedVnni();
  if (g == nullptr) GTEST_SKIP() << "no AVX512-VNNI on this CPU (or PDSERVE_CPU_ISA / PDSERVE_CPU_NO_VNNI turn it off)";
  ExpectGroupedEqualsTiles<BlockQ8_0>(g, &GemmQ8_0Avx2, 21, {4, 7, 16, 17, 40}, {1, 3, 4, 9},
                                      {32, 640, 800, 2048});
}

TEST(GroupedVnniTest, Q5_0BitIdenticalToTheAvx2Tiles) {
  const GroupedKernels* g = Q5_0GroupedVnni();
  if (g == nullptr) GTEST_SKIP() << "no AVX512-VNNI on this CPU (or PDSERVE_CPU_ISA / PDSERVE_CPU_NO_VNNI turn it off)";
  ExpectGroupedEqualsTiles<BlockQ5_0>(g, &GemmQ5_0Avx2, 22, {4, 7, 16, 17, 40}, {1, 3, 4, 9},
                                      {32, 640, 800, 2048});
}

// The same kernel reading Q5_0 blocks in place (a decode step's one group of 16 rows; more groups
// work too, each unpacking the blocks again).
TEST(GroupedVnniTest, Q5_0InPlaceBitIdenticalToTheAvx2Tiles) {
  const GroupedKernels* g = Q5_0GroupedInPlaceVnni();
  if (g == nullptr)
    GTEST_SKIP()
        << "no AVX512-VNNI on this CPU (or PDSERVE_CPU_ISA / PDSERVE_CPU_NO_VNNI turn it off)";
  ASSERT_EQ(g->pack_w, nullptr);
  ExpectGroupedEqualsTiles<BlockQ5_0>(g, &GemmQ5_0Avx2, 29, {4, 12, 16, 17}, {1, 3, 4, 9},
                                      {32, 640, 800, 2048});
}

// The AVX2 grouped Q5_0 kernel (eight activation rows per 256-bit register, prompts on CPUs
// without AVX512-VNNI) gives the tiles' bits: one group, part of one, several and a tail, and
// weight chunks of one row, a few, and more than one 64-row panel (70: a short last panel).
TEST(GroupedAvx2Test, Q5_0BitIdenticalToTheAvx2Tiles) {
  if (Avx2Kernels() == nullptr) GTEST_SKIP() << "AVX2 kernels not available on this build/CPU";
  const GroupedKernels* g = Q5_0GroupedAvx2();
  ASSERT_NE(g, nullptr);
  ExpectGroupedEqualsTiles<BlockQ5_0>(g, &GemmQ5_0Avx2, 25, {1, 7, 8, 12, 17, 40},
                                      {1, 3, 4, 9, 70});
}

// The AVX2 grouped Q8_0 kernel (eight activation rows per register, weights in place) against
// the AVX2 tiles, which it replaces from a few rows on without VNNI: partial and full groups, one
// and two groups per pass, a group left over, and row counts that end panels.
TEST(GroupedAvx2Test, Q8_0BitIdenticalToTheAvx2Tiles) {
  if (Avx2Kernels() == nullptr) GTEST_SKIP() << "AVX2 kernels not available on this build/CPU";
  const GroupedKernels* g = Q8_0GroupedAvx2();
  ASSERT_NE(g, nullptr);
  ExpectGroupedEqualsTiles<BlockQ8_0>(g, &GemmQ8_0Avx2, 26, {1, 3, 5, 8, 12, 16, 17, 24, 33},
                                      {1, 3, 4, 9, 70});
}

// The AVX2 Q8_0 row kernel (one weight row at a time against up to 8 activation rows, CPUs
// without AVX512-VNNI, 1 to 8 rows: decode, a speculative step's K + 1 rows, the output head)
// gives the tiles' bits: every row count from 1 to 8, more than 8 (a second pass of columns),
// and rows long enough (4160 and 8192 weights: 130 and 256 blocks) to cross the 128-block table
// of scale products.
TEST(RowsAvx2Test, Q8_0BitIdenticalToTheAvx2Tiles) {
  if (Avx2Kernels() == nullptr) GTEST_SKIP() << "AVX2 kernels not available on this build/CPU";
  const GroupedKernels* g = Q8_0RowsAvx2();
  ASSERT_NE(g, nullptr);
  ExpectGroupedEqualsTiles<BlockQ8_0>(g, &GemmQ8_0Avx2, 27, {1, 2, 3, 4, 5, 6, 7, 8, 9, 17},
                                      {1, 3, 4, 9}, {32, 640, 4160, 8192});
}

TEST(RowsAvx2Test, Q5_0BitIdenticalToTheAvx2Tiles) {
  if (Avx2Kernels() == nullptr) GTEST_SKIP() << "AVX2 kernels not available on this build/CPU";
  const GroupedKernels* g = Q5_0RowsAvx2();
  ASSERT_NE(g, nullptr);
  ExpectGroupedEqualsTiles<BlockQ5_0>(g, &GemmQ5_0Avx2, 28, {1, 2, 3, 4, 5, 6, 7, 8, 9, 17},
                                      {1, 3, 4, 9}, {32, 640, 4160, 8192});
}

// The small-batch quad kernels (four activation rows per 512-bit register) give the AVX2 tiles'
// bits for Q8_0 and Q5_0 weights, so a decode sequence's logits do not depend on how many other
// sequences (or speculative rows) share its step: every row count from 1 to 11 (one or two groups
// of four per pass, padded groups, a second pass) and 12-16 (what they take on Zen 4, where the
// grouped kernels start at 17 rows), weight rows in steps of four and leftovers.
TEST(QuadVnniTest, Q8_0BitIdenticalToTheAvx2Tiles) {
  const GroupedKernels* g = Q8_0QuadVnni();
  if (g == nullptr) GTEST_SKIP() << "no AVX512-VNNI on this CPU (or PDSERVE_CPU_ISA / PDSERVE_CPU_NO_VNNI turn it off)";
  ExpectGroupedEqualsTiles<BlockQ8_0>(g, &GemmQ8_0Avx2, 23,
                                      {1, 2, 3, 4, 5, 6, 7, 8, 9, 11, 12, 13, 16});
}

TEST(QuadVnniTest, Q5_0BitIdenticalToTheAvx2Tiles) {
  const GroupedKernels* g = Q5_0QuadVnni();
  if (g == nullptr) GTEST_SKIP() << "no AVX512-VNNI on this CPU (or PDSERVE_CPU_ISA / PDSERVE_CPU_NO_VNNI turn it off)";
  ExpectGroupedEqualsTiles<BlockQ5_0>(g, &GemmQ5_0Avx2, 24,
                                      {1, 2, 3, 4, 5, 6, 7, 8, 9, 11, 12, 13, 16});
}

// pdserve's own Q8_0 order (kernels.h, Q8_0OwnOrder*), the output head's where the cache is not
// F32. Runs `g` over weight rows [0, rows) and activation rows [0, n) of k values through pack_x.
std::vector<float> RunOwn(const GroupedKernels* g, const void* w, int64_t rows,
                          const std::vector<BlockQ8_0>& x, int64_t n, int64_t k,
                          size_t block_bytes = sizeof(BlockQ8_0)) {
  const int64_t nb = k / 32;
  std::vector<char> packed(g->x_bytes(n, k) + 64);
  char* xp = packed.data() + (64 - reinterpret_cast<uintptr_t>(packed.data()) % 64) % 64;
  g->pack_x(x.data(), nb * sizeof(BlockQ8_0), n, k, xp);
  // A stride wider than the rows, so that a kernel writing past its rows shows.
  const int64_t ys = rows + 3;
  std::vector<float> y(n * ys, -7.f);
  g->gemm(k, w, nb * block_bytes, rows, xp, n, y.data(), ys);
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t r = rows; r < ys; ++r) EXPECT_EQ(y[i * ys + r], -7.f) << "wrote past row " << r;
  }
  return y;
}

// The VNNI kernel of the own order gives the portable one's bits: weight rows off the register's
// 16 lanes and past several groups (and past the software prefetch's reach), activation rows
// from 1 past two passes of 16, rows of one block up to 4160 weights, codes over their whole
// range (-128 included).
// With `x16`, `simd` is a q8_0x16 kernel and runs on the rows repacked (RepackQ8_0x16).
// `ks`, `row_counts`, `ns`: the shapes (every combination).
void ExpectOwnOrderBits(const GroupedKernels* simd, uint32_t seed, bool x16 = false,
                        const std::vector<int64_t>& ks = {32, 96, 640, 4160},
                        const std::vector<int64_t>& row_counts = {1, 5, 8, 15, 16, 17, 40, 70},
                        const std::vector<int64_t>& ns = {1, 2, 3, 4, 5, 7, 8, 9, 12, 16, 17, 33}) {
  const GroupedKernels* ref = Q8_0OwnOrderScalar();
  std::mt19937 rng(seed);
  for (int64_t k : ks) {
    const int64_t nb = k / 32;
    for (int64_t rows : row_counts) {
      const std::vector<BlockQ8_0> w = RandomWeightBlocks<BlockQ8_0>(rng, rows * nb);
      for (int64_t n : ns) {
        const std::vector<BlockQ8_0> x = RandomActivationBlocks(rng, n * nb);
        const std::vector<float> want = RunOwn(ref, w.data(), rows, x, n, k);
        std::vector<BlockQ8_0> repacked(w.size());
        if (x16) RepackQ8_0x16(w.data(), nb * sizeof(BlockQ8_0), rows, k, repacked.data());
        const std::vector<float> got =
            RunOwn(simd, x16 ? repacked.data() : w.data(), rows, x, n, k);
        for (size_t i = 0; i < want.size(); ++i) {
          ASSERT_EQ(std::bit_cast<uint32_t>(want[i]), std::bit_cast<uint32_t>(got[i]))
              << "k " << k << " rows " << rows << " n " << n << " at " << i << ": " << want[i]
              << " vs " << got[i];
        }
      }
    }
  }
}

TEST(OwnOrderTest, VnniGivesThePortableBits) {
  const GroupedKernels* g = Q8_0OwnOrderVnni();
  if (g == nullptr)
    GTEST_SKIP()
        << "no AVX512-VNNI on this CPU (or PDSERVE_CPU_ISA / PDSERVE_CPU_NO_VNNI turn it off)";
  ExpectOwnOrderBits(g, 42);
}

// The AVX2 kernels of the own order (own_order_avx2.cc) give the portable bits too: on plain rows
// (each group laid out in scratch) and on q8_0x16 (below), on any CPU with AVX2.
TEST(OwnOrderTest, Avx2GivesThePortableBits) {
  const GroupedKernels* g = Q8_0OwnOrderAvx2();
  if (g == nullptr) GTEST_SKIP() << "no AVX2 on this CPU (or PDSERVE_CPU_ISA=scalar)";
  ExpectOwnOrderBits(g, 142);
}

// q8_0x16 (engine/quant/q8_0x16.h): where the header says each byte goes, and back. Rows past the
// last full group of 16 stay plain.
TEST(OwnOrderTest, Q8_0x16LayoutIsTheHeadersAndUnpacksToTheSource) {
  std::mt19937 rng(44);
  for (int64_t k : {32, 96, 640}) {  // 96: an odd block count, its last block alone
    const int64_t nb = k / 32;
    for (int64_t rows : {1, 15, 16, 17, 37, 48}) {
      const std::vector<BlockQ8_0> w = RandomWeightBlocks<BlockQ8_0>(rng, rows * nb);
      std::vector<BlockQ8_0> packed(w.size());
      RepackQ8_0x16(w.data(), nb * sizeof(BlockQ8_0), rows, k, packed.data());
      const auto* bytes = reinterpret_cast<const uint8_t*>(packed.data());
      const int64_t full = rows / 16 * 16;
      for (int64_t r = 0; r < rows; ++r) {
        std::vector<BlockQ8_0> back(nb);
        UnpackQ8_0x16Row(packed.data(), rows, k, r, back.data());
        ASSERT_EQ(std::memcmp(back.data(), &w[r * nb], nb * sizeof(BlockQ8_0)), 0) << r;
        for (int64_t b = 0; b < nb; ++b) {
          const BlockQ8_0& src = w[r * nb + b];
          if (r >= full) {
            EXPECT_EQ(std::memcmp(bytes + (r * nb + b) * 34, &src, 34), 0) << r;
            continue;
          }
          // Blocks in pairs: codes 2p, 2p + 1, then their scales; a last odd block alone.
          const uint8_t* pair = bytes + (r / 16) * 16 * nb * 34 + (b / 2) * 1088;
          const int64_t in_pair = b / 2 * 2 + 1 < nb ? 2 : 1;
          const int64_t e = r % 16;
          uint16_t d;
          std::memcpy(&d, pair + in_pair * 512 + (b % 2) * 32 + e * 2, 2);
          EXPECT_EQ(d, src.d) << r << " " << b;
          for (int i = 0; i < 32; ++i) {
            ASSERT_EQ(pair[(b % 2) * 512 + (i / 4) * 64 + e * 4 + i % 4], src.qs[i] + 128)
                << "row " << r << " block " << b << " code " << i;
          }
        }
      }
    }
  }
}

// The q8_0x16 kernels give the portable kernel's bits on the source rows: the same cases as
// above, tails of 1-15 plain rows after the groups included.
TEST(OwnOrderTest, X16KernelsGiveThePortableBits) {
  ExpectOwnOrderBits(Q8_0x16OwnOrderScalar(), 45, /*x16=*/true);
  const GroupedKernels* g = Q8_0x16OwnOrderVnni();
  if (g == nullptr)
    GTEST_SKIP()
        << "no AVX512-VNNI on this CPU (or PDSERVE_CPU_ISA / PDSERVE_CPU_NO_VNNI turn it off)";
  ExpectOwnOrderBits(g, 46, /*x16=*/true);
}

TEST(OwnOrderTest, X16Avx2KernelGivesThePortableBits) {
  const GroupedKernels* g = Q8_0x16OwnOrderAvx2();
  if (g == nullptr) GTEST_SKIP() << "no AVX2 on this CPU (or PDSERVE_CPU_ISA=scalar)";
  ExpectOwnOrderBits(g, 146, /*x16=*/true);
  // A long stream (the output head's shape), one to nine activation rows.
  ExpectOwnOrderBits(g, 147, /*x16=*/true, {640}, {800 * 16 + 7}, {1, 3, 4, 9});
}

// The AMX kernel (own_order_amx.cc) gives the portable bits: activation rows 1 (the VNNI kernel)
// to 16 in one pass, and past it with a last pass of n % 16 rows (17, 33) or none (32, 48).
TEST(OwnOrderTest, X16AmxKernelsGiveThePortableBits) {
  const GroupedKernels* g = Q8_0x16OwnOrderAmx();
  if (g == nullptr)
    GTEST_SKIP() << "no AMX-INT8 on this CPU (or the OS, PDSERVE_CPU_* turn it off)";
  ExpectOwnOrderBits(g, 246, /*x16=*/true, {32, 96, 640, 4160}, {1, 15, 16, 17, 40, 70},
                     {1, 2, 3, 4, 5, 7, 8, 9, 12, 13, 15, 16, 17, 32, 33, 48});
  // Codes of -128 in the activations too (TDPBSUD takes the whole signed range).
  std::mt19937 rng(247);
  const int64_t k = 640, nb = k / 32, rows = 48 + 5;
  const std::vector<BlockQ8_0> w = RandomWeightBlocks<BlockQ8_0>(rng, rows * nb);
  std::vector<BlockQ8_0> laid(w.size());
  RepackQ8_0x16(w.data(), nb * sizeof(BlockQ8_0), rows, k, laid.data());
  for (int64_t n : {4, 19}) {
    std::vector<BlockQ8_0> x = RandomActivationBlocks(rng, n * nb);
    for (BlockQ8_0& xb : x) xb.qs[rng() % 32] = -128;
    const std::vector<float> want = RunOwn(Q8_0OwnOrderScalar(), w.data(), rows, x, n, k);
    const std::vector<float> got = RunOwn(g, laid.data(), rows, x, n, k);
    for (size_t i = 0; i < want.size(); ++i) {
      ASSERT_EQ(std::bit_cast<uint32_t>(want[i]), std::bit_cast<uint32_t>(got[i]))
          << "n " << n << " at " << i;
    }
  }
}

// An activation code of -128 (QuantizeQ8_0 never makes one: |x| / d <= 127) is beyond the AVX2
// q8_0x16 kernel's sign trick (VPSIGNB cannot negate it), so such a call takes the portable
// kernel: the same bits whatever the codes.
TEST(OwnOrderTest, X16Avx2KernelTakesMinus128Activations) {
  const GroupedKernels* g = Q8_0x16OwnOrderAvx2();
  if (g == nullptr) GTEST_SKIP() << "no AVX2 on this CPU (or PDSERVE_CPU_ISA=scalar)";
  std::mt19937 rng(148);
  const int64_t k = 640, nb = k / 32, rows = 48 + 5;
  std::vector<BlockQ8_0> w = RandomWeightBlocks<BlockQ8_0>(rng, rows * nb);
  for (int64_t r = 0; r < rows; ++r) w[r * nb].qs[0] = -128;  // w = x = -128 in the same place
  std::vector<BlockQ8_0> laid(w.size());
  RepackQ8_0x16(w.data(), nb * sizeof(BlockQ8_0), rows, k, laid.data());
  for (int64_t n : {1, 4}) {
    std::vector<BlockQ8_0> x = RandomActivationBlocks(rng, n * nb);
    x[(n - 1) * nb].qs[0] = -128;
    const std::vector<float> want = RunOwn(Q8_0OwnOrderScalar(), w.data(), rows, x, n, k);
    for (const auto& [what, got] :
         {std::pair{"q8_0x16", RunOwn(g, laid.data(), rows, x, n, k)},
          std::pair{"plain", RunOwn(Q8_0OwnOrderAvx2(), w.data(), rows, x, n, k)}}) {
      for (size_t i = 0; i < want.size(); ++i) {
        ASSERT_EQ(std::bit_cast<uint32_t>(want[i]), std::bit_cast<uint32_t>(got[i]))
            << what << " n " << n << " at " << i;
      }
    }
  }
}

// And over a stream as long as a model's output head (at least 8 MiB of weights in one call), where
// the kernels pick other paths by the activation rows and the CPU's vendor: on VNNI
// (own_order_vnni.cc, FetchFor) for rows of 640 weights no software prefetch up to 3 rows on AMD,
// a near L1 prefetch at 1-2 rows on Intel, for rows of 2048 the L1 prefetch at one row, the
// five-row tile with its fifth row computed and not stored at 4, the prefetch into L2 from 5; on
// AMX the VNNI kernel at 2 rows over the 640-weight stream (kAmxMinRowsQ8_0Head); on AVX2 the
// same vendor rules (kernels.h, HeadStream / NearPrefetch). Each kernel set that runs here,
// against the portable bits.
TEST(OwnOrderTest, X16KernelsGiveThePortableBitsOverALongStream) {
  const std::pair<const char*, const GroupedKernels*> sets[] = {{"vnni", Q8_0x16OwnOrderVnni()},
                                                                {"amx", Q8_0x16OwnOrderAmx()},
                                                                {"avx2", Q8_0x16OwnOrderAvx2()}};
  int ran = 0;
  for (const auto& [name, g] : sets) {
    if (g == nullptr) continue;
    SCOPED_TRACE(name);
    ++ran;
    // 8.7 and 8.9 MB of groups, each with a plain tail.
    for (const auto& [k, rows] :
         {std::pair<int64_t, int64_t>{640, 800 * 16 + 7}, {2048, 256 * 16 + 3}}) {
      ASSERT_GE(rows / 16 * 16 * (k / 32) * static_cast<int64_t>(sizeof(BlockQ8_0)),
                int64_t{8} << 20);
      ExpectOwnOrderBits(g, 47, /*x16=*/true, {k}, {rows}, {1, 2, 3, 4, 5});
    }
  }
  if (ran == 0) GTEST_SKIP() << "no AVX2 on this CPU (or PDSERVE_CPU_ISA turns it off)";
}

// A weight block's codes as values: Q8_0's as stored, Q5_0's (nibble | fifth bit << 4) - 16.
int BlockCode(const BlockQ8_0& b, int j) { return b.qs[j]; }
int BlockCode(const BlockQ5_0& b, int j) {
  uint32_t qh;
  std::memcpy(&qh, b.qh, 4);
  const int nibble = j < 16 ? b.qs[j] & 15 : b.qs[j - 16] >> 4;
  return (nibble | static_cast<int>(((qh >> j) & 1) << 4)) - 16;
}

// The portable kernel of weights W is the order it states: each output one F32 chain over its
// blocks. Against the exact sum of the same products (double, d_w * d_x unrounded): the product
// d_w * d_x rounds once (relative u = 2^-24) and each of the nb additions once more, so the error
// is at most (nb + 1) u sum |d_w d_x isum| to first order (1.001: the second-order terms). Each
// output is also recomputed here as the chain itself, which must give its bits exactly.
template <typename W>
void ExpectOneChainPerOutput(const GroupedKernels* g, uint32_t seed) {
  std::mt19937 rng(seed);
  for (int64_t k : {32, 640, 4160}) {
    const int64_t nb = k / 32, rows = 9, n = 5;
    const std::vector<W> w = RandomWeightBlocks<W>(rng, rows * nb);
    const std::vector<BlockQ8_0> x = RandomActivationBlocks(rng, n * nb);
    const std::vector<float> y = RunOwn(g, w.data(), rows, x, n, k, sizeof(W));
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t r = 0; r < rows; ++r) {
        double exact = 0, magnitude = 0;
        float chain = 0.f;
        for (int64_t b = 0; b < nb; ++b) {
          const W& wb = w[r * nb + b];
          const BlockQ8_0& xb = x[i * nb + b];
          int32_t isum = 0;
          for (int j = 0; j < 32; ++j) isum += BlockCode(wb, j) * xb.qs[j];
          const double term = double{F16ToF32(wb.d)} * F16ToF32(xb.d) * isum;
          exact += term;
          magnitude += std::abs(term);
          chain = std::fma(F16ToF32(wb.d) * F16ToF32(xb.d), static_cast<float>(isum), chain);
        }
        const float got = y[i * (rows + 3) + r];
        EXPECT_EQ(std::bit_cast<uint32_t>(chain), std::bit_cast<uint32_t>(got)) << k << " " << r;
        EXPECT_LE(std::abs(got - exact), 1.001 * (nb + 1) * std::ldexp(1.0, -24) * magnitude)
            << "k " << k << " row " << r << " x " << i;
      }
    }
  }
}

TEST(OwnOrderTest, PortableKernelIsOneChainPerOutput) {
  ExpectOneChainPerOutput<BlockQ8_0>(Q8_0OwnOrderScalar(), 43);
}

// Q5_0's: isum = sum (code - 16) * x per block.
TEST(OwnOrderTest, PortableQ5_0KernelIsOneChainPerOutput) {
  ExpectOneChainPerOutput<BlockQ5_0>(Q5_0OwnOrderScalar(), 49);
}

// q5_0x16 (engine/quant/q5_0x16.h): where the header says each byte and bit goes, and back.
TEST(OwnOrderTest, Q5_0x16LayoutIsTheHeadersAndUnpacksToTheSource) {
  std::mt19937 rng(47);
  for (int64_t k : {32, 96, 640}) {  // 96: an odd block count, its last block alone
    const int64_t nb = k / 32;
    for (int64_t rows : {16, 48}) {
      const std::vector<BlockQ5_0> w = RandomWeightBlocks<BlockQ5_0>(rng, rows * nb);
      std::vector<BlockQ5_0> packed(w.size());
      RepackQ5_0x16(w.data(), nb * sizeof(BlockQ5_0), rows, k, packed.data());
      const auto* bytes = reinterpret_cast<const uint8_t*>(packed.data());
      for (int64_t r = 0; r < rows; ++r) {
        std::vector<BlockQ5_0> back(nb);
        UnpackQ5_0x16Row(packed.data(), k, r, back.data());
        ASSERT_EQ(std::memcmp(back.data(), &w[r * nb], nb * sizeof(BlockQ5_0)), 0) << r;
        for (int64_t b = 0; b < nb; ++b) {
          const BlockQ5_0& src = w[r * nb + b];
          // Blocks in pairs: nibbles 2p, 2p + 1, their masks, their scales; a last odd block alone.
          const uint8_t* pair = bytes + (r / 16) * 16 * nb * 22 + (b / 2) * 704;
          const int64_t in_pair = b / 2 * 2 + 1 < nb ? 2 : 1;
          const int64_t e = r % 16;
          uint16_t d;
          std::memcpy(&d, pair + in_pair * 320 + (b % 2) * 32 + e * 2, 2);
          EXPECT_EQ(d, src.d) << r << " " << b;
          uint32_t qh;
          std::memcpy(&qh, src.qh, 4);
          for (int i = 0; i < 32; ++i) {
            const uint8_t nib = pair[(b % 2) * 256 + ((i % 16) / 4) * 64 + e * 4 + i % 4];
            ASSERT_EQ(i < 16 ? nib & 15 : nib >> 4, i < 16 ? src.qs[i] & 15 : src.qs[i - 16] >> 4)
                << "row " << r << " block " << b << " code " << i;
            uint64_t mask;
            std::memcpy(&mask, pair + in_pair * 256 + (b % 2) * 64 + (i / 4) * 8, 8);
            ASSERT_EQ((mask >> (4 * e + i % 4)) & 1, (qh >> i) & 1)
                << "row " << r << " block " << b << " code " << i;
          }
        }
      }
    }
  }
}

// The Q5_0 own order's kernels give the portable one's bits on the plain rows: the q5_0x16
// kernels (portable and VNNI) on the rows laid out (groups of 16, up to several groups past the
// prefetch's reach), and the VNNI kernel on plain rows (any count: a part group padded), for
// activation rows from 1 past two passes of 16, rows of one block up to 4160 weights (an odd
// block count too), codes over their whole range.
TEST(OwnOrderTest, Q5_0KernelsGiveThePortableBits) {
  const GroupedKernels* ref = Q5_0OwnOrderScalar();
  const GroupedKernels* x16_vnni = Q5_0x16OwnOrderVnni();
  const GroupedKernels* plain_vnni = Q5_0OwnOrderVnni();
  const GroupedKernels* x16_avx2 = Q5_0x16OwnOrderAvx2();
  const GroupedKernels* plain_avx2 = Q5_0OwnOrderAvx2();
  const GroupedKernels* x16_amx = Q5_0x16OwnOrderAmx();
  std::mt19937 rng(48);
  for (int64_t k : {32, 96, 640, 4160}) {
    const int64_t nb = k / 32;
    for (int64_t rows : {1, 5, 15, 16, 17, 32, 48, 70, 160}) {
      const std::vector<BlockQ5_0> w = RandomWeightBlocks<BlockQ5_0>(rng, rows * nb);
      std::vector<BlockQ5_0> laid(w.size());
      if (rows % 16 == 0) RepackQ5_0x16(w.data(), nb * sizeof(BlockQ5_0), rows, k, laid.data());
      for (int64_t n : {1, 2, 3, 4, 5, 7, 8, 9, 12, 16, 17, 32, 33}) {
        std::vector<BlockQ8_0> x = RandomActivationBlocks(rng, n * nb);
        // -128, beyond QuantizeQ8_0's codes, in every block: within the AVX2 kernel's int16 sums.
        for (BlockQ8_0& xb : x) xb.qs[rng() % 32] = -128;
        const std::vector<float> want = RunOwn(ref, w.data(), rows, x, n, k, sizeof(BlockQ5_0));
        std::vector<std::pair<const char*, std::vector<float>>> got;
        if (rows % 16 == 0) {
          got.emplace_back("q5_0x16 portable", RunOwn(Q5_0x16OwnOrderScalar(), laid.data(), rows, x,
                                                      n, k, sizeof(BlockQ5_0)));
          if (x16_vnni != nullptr) {
            got.emplace_back("q5_0x16 vnni",
                             RunOwn(x16_vnni, laid.data(), rows, x, n, k, sizeof(BlockQ5_0)));
          }
          if (x16_avx2 != nullptr) {
            got.emplace_back("q5_0x16 avx2",
                             RunOwn(x16_avx2, laid.data(), rows, x, n, k, sizeof(BlockQ5_0)));
          }
          if (x16_amx != nullptr) {
            got.emplace_back("q5_0x16 amx",
                             RunOwn(x16_amx, laid.data(), rows, x, n, k, sizeof(BlockQ5_0)));
          }
        }
        if (plain_avx2 != nullptr) {
          got.emplace_back("plain avx2",
                           RunOwn(plain_avx2, w.data(), rows, x, n, k, sizeof(BlockQ5_0)));
        }
        if (plain_vnni != nullptr) {
          got.emplace_back("plain vnni",
                           RunOwn(plain_vnni, w.data(), rows, x, n, k, sizeof(BlockQ5_0)));
        }
        for (const auto& [what, y] : got) {
          for (size_t i = 0; i < want.size(); ++i) {
            ASSERT_EQ(std::bit_cast<uint32_t>(want[i]), std::bit_cast<uint32_t>(y[i]))
                << what << ": k " << k << " rows " << rows << " n " << n << " at " << i << ": "
                << want[i] << " vs " << y[i];
          }
        }
      }
    }
  }
  if (x16_vnni == nullptr && x16_avx2 == nullptr) {
    GTEST_SKIP() << "portable kernels only: no AVX2 on this CPU (or PDSERVE_CPU_ISA=scalar)";
  }
}

// Q4_K weights over their whole ranges: every nibble, every 6-bit scale and min (random scale
// bytes: the packing is one-to-one), d and dmin from 2^-14 to about 0.5.
std::vector<BlockQ4_K> RandomQ4KBlocks(std::mt19937& rng, size_t count) {
  std::uniform_int_distribution<int> byte(0, 255), half(0x0400, 0x3800);
  std::vector<BlockQ4_K> v(count);
  for (BlockQ4_K& b : v) {
    b.d = static_cast<uint16_t>(half(rng));
    b.dmin = static_cast<uint16_t>(half(rng));
    for (uint8_t& c : b.scales) c = static_cast<uint8_t>(byte(rng));
    for (uint8_t& c : b.qs) c = static_cast<uint8_t>(byte(rng));
  }
  return v;
}

// Q8_K activations with codes over -128..127 (quantize_q8_k's range is -127..127; -128 is the
// worst case for the sums) and their exact bsums.
std::vector<BlockQ8_K> RandomQ8KBlocks(std::mt19937& rng, size_t count) {
  std::uniform_int_distribution<int> code(-128, 127);
  std::uniform_real_distribution<float> d(1e-4f, 1e-1f);
  std::vector<BlockQ8_K> v(count);
  for (BlockQ8_K& b : v) {
    b.d = d(rng);
    for (int g = 0; g < 16; ++g) {
      int sum = 0;
      for (int t = 0; t < 16; ++t) {
        b.qs[16 * g + t] = static_cast<int8_t>(code(rng));
        sum += b.qs[16 * g + t];
      }
      b.bsums[g] = static_cast<int16_t>(sum);
    }
  }
  return v;
}

// One own-order kernel table over k-quant weights (`row_bytes` apart) and Q8_K activations.
std::vector<float> RunOwnK(const GroupedKernels* g, const void* w, int64_t rows,
                           const std::vector<BlockQ8_K>& x, int64_t n, int64_t k,
                           size_t row_bytes) {
  std::vector<char> packed(g->x_bytes(n, k) + 64);
  char* xp = packed.data() + (64 - reinterpret_cast<uintptr_t>(packed.data()) % 64) % 64;
  g->pack_x(x.data(), k / kQK * sizeof(BlockQ8_K), n, k, xp);
  const int64_t ys = rows + 3;  // wider than the rows: a kernel writing past them shows
  std::vector<float> y(n * ys, -7.f);
  g->gemm(k, w, row_bytes, rows, xp, n, y.data(), ys);
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t r = rows; r < ys; ++r) EXPECT_EQ(y[i * ys + r], -7.f) << "wrote past row " << r;
  }
  return y;
}

// q4_Kx16 (engine/quant/q4_kx16.h): where the header says each byte goes, and back.
TEST(OwnOrderTest, Q4_Kx16LayoutIsTheHeadersAndUnpacksToTheSource) {
  std::mt19937 rng(51);
  for (int64_t k : {256, 768}) {
    const int64_t nbk = k / kQK;
    for (int64_t rows : {16, 48}) {
      const std::vector<BlockQ4_K> w = RandomQ4KBlocks(rng, rows * nbk);
      std::vector<uint8_t> laid(rows * nbk * kQ4_Kx16RowBytes);
      RepackQ4_Kx16(w.data(), nbk * sizeof(BlockQ4_K), rows, k, laid.data());
      for (int64_t r = 0; r < rows; ++r) {
        std::vector<BlockQ4_K> back(nbk);
        UnpackQ4_Kx16Row(laid.data(), k, r, back.data());
        ASSERT_EQ(std::memcmp(back.data(), &w[r * nbk], nbk * sizeof(BlockQ4_K)), 0) << r;
        const int e = static_cast<int>(r % 16);
        for (int64_t s = 0; s < nbk; ++s) {
          const BlockQ4_K& src = w[r * nbk + s];
          const uint8_t* sb = laid.data() + (r / 16) * 16 * nbk * 148 + s * 2368;
          for (int j = 0; j < 8; ++j) {
            int sc, m;
            GetScaleMinK4(j, src.scales, &sc, &m);
            EXPECT_EQ(sb[16 * j + e], sc) << r << " " << s << " " << j;
            EXPECT_EQ(sb[128 + 32 * (j / 2) + 2 * e + j % 2], m) << r << " " << s << " " << j;
            for (int t = 0; t < 32; ++t) {
              const uint8_t byte = sb[320 + ((j / 2) * 8 + t / 4) * 64 + e * 4 + t % 4];
              ASSERT_EQ(j % 2 == 0 ? byte & 15 : byte >> 4,
                        j % 2 == 0 ? src.qs[32 * (j / 2) + t] & 15 : src.qs[32 * (j / 2) + t] >> 4)
                  << "row " << r << " super-block " << s << " sub-block " << j << " code " << t;
            }
          }
          uint16_t d, dmin;
          std::memcpy(&d, sb + 256 + 2 * e, 2);
          std::memcpy(&dmin, sb + 288 + 2 * e, 2);
          EXPECT_EQ(d, src.d);
          EXPECT_EQ(dmin, src.dmin);
        }
      }
    }
  }
}

// The Q4_K own order's portable kernel is one F32 chain per output, two FMAs per super-block
// (stated here independently from the blocks), within (2 nbk + 3) u sum(|d_w d_x sumi| +
// |dmin_w d_x summ|) of the exact sum: 2 nbk roundings of the chain, one of each product
// d * d_x and one of sumi's conversion (|sumi| may pass 2^24).
TEST(OwnOrderTest, PortableQ4_KKernelIsOneChainPerOutput) {
  std::mt19937 rng(52);
  for (int64_t k : {256, 1024, 4096}) {
    const int64_t nbk = k / kQK, rows = 9, n = 3;
    const std::vector<BlockQ4_K> w = RandomQ4KBlocks(rng, rows * nbk);
    const std::vector<BlockQ8_K> x = RandomQ8KBlocks(rng, n * nbk);
    const std::vector<float> y =
        RunOwnK(Q4_KOwnOrderScalar(), w.data(), rows, x, n, k, nbk * sizeof(BlockQ4_K));
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t r = 0; r < rows; ++r) {
        float chain = 0.f;
        double exact = 0, magnitude = 0;
        for (int64_t s = 0; s < nbk; ++s) {
          const BlockQ4_K& wb = w[r * nbk + s];
          const BlockQ8_K& xb = x[i * nbk + s];
          int64_t sumi = 0, summ = 0;
          for (int j = 0; j < 8; ++j) {
            int sc, m;
            GetScaleMinK4(j, wb.scales, &sc, &m);
            int64_t isum = 0, xsum = 0;
            for (int t = 0; t < 32; ++t) {
              const int q = (wb.qs[32 * (j / 2) + t] >> (4 * (j % 2))) & 15;
              isum += q * xb.qs[32 * j + t];
              xsum += xb.qs[32 * j + t];
            }
            sumi += sc * isum;
            summ += m * xsum;
          }
          const float dw = F16ToF32(wb.d), dm = F16ToF32(wb.dmin);
          chain = std::fma(dw * xb.d, static_cast<float>(sumi), chain);
          chain = std::fma(-(dm * xb.d), static_cast<float>(summ), chain);
          const double t1 = double{dw} * xb.d * sumi, t2 = double{dm} * xb.d * summ;
          exact += t1 - t2;
          magnitude += std::abs(t1) + std::abs(t2);
        }
        const float got = y[i * (rows + 3) + r];
        EXPECT_EQ(std::bit_cast<uint32_t>(chain), std::bit_cast<uint32_t>(got)) << k << " " << r;
        EXPECT_LE(std::abs(got - exact), 1.001 * (2 * nbk + 3) * std::ldexp(1.0, -24) * magnitude)
            << "k " << k << " row " << r << " x " << i;
      }
    }
  }
}

// The k-quant own orders' kernels give the portable one's bits: the x16 kernels (portable, VNNI
// and AVX2) on the rows laid out (groups of 16, up to several past the prefetch's reach), and the
// VNNI and AVX2 kernels on plain rows (any count: a part group padded), for activation rows from
// 1 past two passes of 8 (and one of 16), rows of 1 to 16 super-blocks, codes and scales over
// their whole ranges.
template <typename Block>
void ExpectKQuantKernelsGiveThePortableBits(
    uint32_t seed, const GroupedKernels* ref, const GroupedKernels* x16_portable,
    const GroupedKernels* x16_vnni, const GroupedKernels* plain_vnni,
    const GroupedKernels* x16_avx2, const GroupedKernels* plain_avx2, size_t laid_row_bytes,
    std::vector<Block> (*random_blocks)(std::mt19937&, size_t),
    void (*repack)(const void*, size_t, int64_t, int64_t, void*),
    const GroupedKernels* x16_amx = nullptr) {
  std::mt19937 rng(seed);
  for (int64_t k : {256, 768, 2048, 4096}) {
    const int64_t nbk = k / kQK;
    for (int64_t rows : {1, 5, 16, 17, 32, 48, 160}) {
      const std::vector<Block> w = random_blocks(rng, rows * nbk);
      std::vector<uint8_t> laid(rows * nbk * laid_row_bytes);
      if (rows % 16 == 0) repack(w.data(), nbk * sizeof(Block), rows, k, laid.data());
      for (int64_t n : {1, 2, 3, 4, 5, 8, 9, 16, 17, 32, 35}) {
        const std::vector<BlockQ8_K> x = RandomQ8KBlocks(rng, n * nbk);
        const std::vector<float> want = RunOwnK(ref, w.data(), rows, x, n, k, nbk * sizeof(Block));
        std::vector<std::pair<const char*, std::vector<float>>> got;
        if (rows % 16 == 0) {
          got.emplace_back("x16 portable",
                           RunOwnK(x16_portable, laid.data(), rows, x, n, k, nbk * laid_row_bytes));
          if (x16_vnni != nullptr) {
            got.emplace_back("x16 vnni",
                             RunOwnK(x16_vnni, laid.data(), rows, x, n, k, nbk * laid_row_bytes));
          }
          if (x16_avx2 != nullptr) {
            got.emplace_back("x16 avx2",
                             RunOwnK(x16_avx2, laid.data(), rows, x, n, k, nbk * laid_row_bytes));
          }
          if (x16_amx != nullptr) {
            got.emplace_back("x16 amx",
                             RunOwnK(x16_amx, laid.data(), rows, x, n, k, nbk * laid_row_bytes));
          }
        }
        if (plain_vnni != nullptr) {
          got.emplace_back("plain vnni",
                           RunOwnK(plain_vnni, w.data(), rows, x, n, k, nbk * sizeof(Block)));
        }
        if (plain_avx2 != nullptr) {
          got.emplace_back("plain avx2",
                           RunOwnK(plain_avx2, w.data(), rows, x, n, k, nbk * sizeof(Block)));
        }
        for (const auto& [what, y] : got) {
          for (size_t i = 0; i < want.size(); ++i) {
            ASSERT_EQ(std::bit_cast<uint32_t>(want[i]), std::bit_cast<uint32_t>(y[i]))
                << what << ": k " << k << " rows " << rows << " n " << n << " at " << i << ": "
                << want[i] << " vs " << y[i];
          }
        }
      }
    }
  }
}

TEST(OwnOrderTest, Q4_KKernelsGiveThePortableBits) {
  ExpectKQuantKernelsGiveThePortableBits<BlockQ4_K>(
      53, Q4_KOwnOrderScalar(), Q4_Kx16OwnOrderScalar(), Q4_Kx16OwnOrderVnni(), Q4_KOwnOrderVnni(),
      Q4_Kx16OwnOrderAvx2(), Q4_KOwnOrderAvx2(), kQ4_Kx16RowBytes, &RandomQ4KBlocks, &RepackQ4_Kx16,
      Q4_Kx16OwnOrderAmx());
  if (Q4_Kx16OwnOrderAvx2() == nullptr) {
    GTEST_SKIP() << "portable kernels only: no AVX2 on this CPU (or PDSERVE_CPU_ISA=scalar)";
  }
}

// Q6_K weights over their whole ranges: every 6-bit code, every int8 scale (-128 included), d
// from 2^-14 to about 0.5.
std::vector<BlockQ6_K> RandomQ6KBlocks(std::mt19937& rng, size_t count) {
  std::uniform_int_distribution<int> byte(0, 255), half(0x0400, 0x3800);
  std::vector<BlockQ6_K> v(count);
  for (BlockQ6_K& b : v) {
    b.d = static_cast<uint16_t>(half(rng));
    for (int8_t& c : b.scales) c = static_cast<int8_t>(byte(rng) - 128);
    for (uint8_t& c : b.ql) c = static_cast<uint8_t>(byte(rng));
    for (uint8_t& c : b.qh) c = static_cast<uint8_t>(byte(rng));
  }
  return v;
}

// Weight w's 6-bit code (0..63, the weight + 32) of a Q6_K block, from its definition
// (k_quants.cc, DequantizeRow).
int Q6KCode(const BlockQ6_K& b, int w) {
  const int h = w / 128, k = (w % 128) / 32, l = w % 32;
  return ((b.ql[64 * h + 32 * (k & 1) + l] >> (4 * (k / 2))) & 15) |
         (((b.qh[32 * h + l] >> (2 * k)) & 3) << 4);
}

// q6_Kx16 (engine/quant/q6_kx16.h): where the header says each byte goes, and back.
TEST(OwnOrderTest, Q6_Kx16LayoutIsTheHeadersAndUnpacksToTheSource) {
  std::mt19937 rng(54);
  for (int64_t k : {256, 768}) {
    const int64_t nbk = k / kQK;
    for (int64_t rows : {16, 48}) {
      const std::vector<BlockQ6_K> w = RandomQ6KBlocks(rng, rows * nbk);
      std::vector<uint8_t> laid(rows * nbk * sizeof(BlockQ6_K));
      RepackQ6_Kx16(w.data(), nbk * sizeof(BlockQ6_K), rows, k, laid.data());
      for (int64_t r = 0; r < rows; ++r) {
        std::vector<BlockQ6_K> back(nbk);
        UnpackQ6_Kx16Row(laid.data(), k, r, back.data());
        ASSERT_EQ(std::memcmp(back.data(), &w[r * nbk], nbk * sizeof(BlockQ6_K)), 0) << r;
        const int e = static_cast<int>(r % 16);
        for (int64_t s = 0; s < nbk; ++s) {
          const BlockQ6_K& src = w[r * nbk + s];
          const uint8_t* sb = laid.data() + (r / 16) * 16 * nbk * 210 + s * 3360;
          for (int j = 0; j < 16; ++j) {
            EXPECT_EQ(static_cast<int8_t>(sb[32 * (j / 2) + 2 * e + j % 2]), src.scales[j]);
          }
          uint16_t d;
          std::memcpy(&d, sb + 256 + 2 * e, 2);
          EXPECT_EQ(d, src.d);
          // The header's rule for the 32 weights 32G + 4t .. + 3 (G = 4h + k).
          for (int w32 = 0; w32 < 256; ++w32) {
            const int g = w32 / 32, h = g / 4, kk = g % 4, t = (w32 % 32) / 4, byte = w32 % 4;
            const uint8_t lo = sb[288 + (16 * h + 8 * (kk % 2) + t) * 64 + e * 4 + byte];
            const uint8_t hi = sb[2336 + (8 * h + t) * 64 + e * 4 + byte];
            const int code = ((lo >> (4 * (kk / 2))) & 15) | (((hi >> (2 * kk)) & 3) << 4);
            ASSERT_EQ(code, Q6KCode(src, w32))
                << "row " << r << " super-block " << s << " w " << w32;
          }
        }
      }
    }
  }
}

// The Q6_K own order's portable kernel is one F32 chain per output, one FMA per super-block
// (stated here from the definition), within (nbk + 2) u sum |d_w d_x total| of the exact sum:
// nbk roundings of the chain, one of d * d_x and one of total's conversion.
TEST(OwnOrderTest, PortableQ6_KKernelIsOneChainPerOutput) {
  std::mt19937 rng(55);
  for (int64_t k : {256, 1024, 4096}) {
    const int64_t nbk = k / kQK, rows = 9, n = 3;
    const std::vector<BlockQ6_K> w = RandomQ6KBlocks(rng, rows * nbk);
    const std::vector<BlockQ8_K> x = RandomQ8KBlocks(rng, n * nbk);
    const std::vector<float> y =
        RunOwnK(Q6_KOwnOrderScalar(), w.data(), rows, x, n, k, nbk * sizeof(BlockQ6_K));
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t r = 0; r < rows; ++r) {
        float chain = 0.f;
        double exact = 0, magnitude = 0;
        for (int64_t s = 0; s < nbk; ++s) {
          const BlockQ6_K& wb = w[r * nbk + s];
          const BlockQ8_K& xb = x[i * nbk + s];
          int64_t total = 0;
          for (int w32 = 0; w32 < 256; ++w32) {
            total += int64_t{wb.scales[w32 / 16]} * (Q6KCode(wb, w32) - 32) * xb.qs[w32];
          }
          const float dw = F16ToF32(wb.d);
          chain = std::fma(dw * xb.d, static_cast<float>(total), chain);
          const double term = double{dw} * xb.d * total;
          exact += term;
          magnitude += std::abs(term);
        }
        const float got = y[i * (rows + 3) + r];
        EXPECT_EQ(std::bit_cast<uint32_t>(chain), std::bit_cast<uint32_t>(got)) << k << " " << r;
        EXPECT_LE(std::abs(got - exact), 1.001 * (nbk + 2) * std::ldexp(1.0, -24) * magnitude)
            << "k " << k << " row " << r << " x " << i;
      }
    }
  }
}

TEST(OwnOrderTest, Q6_KKernelsGiveThePortableBits) {
  ExpectKQuantKernelsGiveThePortableBits<BlockQ6_K>(
      56, Q6_KOwnOrderScalar(), Q6_Kx16OwnOrderScalar(), Q6_Kx16OwnOrderVnni(), Q6_KOwnOrderVnni(),
      nullptr, nullptr, sizeof(BlockQ6_K), &RandomQ6KBlocks, &RepackQ6_Kx16);
  if (Q6_Kx16OwnOrderVnni() == nullptr || Q6_KOwnOrderVnni() == nullptr) {
    GTEST_SKIP() << "portable kernels only: no AVX512-VNNI on this CPU (or PDSERVE_CPU_ISA / "
                    "PDSERVE_CPU_NO_VNNI turn it off)";
  }
}

// INT8 KV quantization (kernels.h, engine/backend/kv_layout.h): bit-exact between the tables, and
// a round trip within half a step: |x - scale * q| <= scale / 2 (ties go to even, so equality is
// possible; the 1.0001 allows the rounding of x * (1 / scale)). A million values over lengths with
// SIMD tails, magnitudes from 1e-30 to 1e30, all-zero heads, and one huge outlier per head.
TEST_F(KernelsTest, QuantizeKvI8BitExactAndRoundTrip) {
  int64_t values = 0;
  std::uniform_real_distribution<float> log_mag(-30.f, 30.f);
  while (values < 1000000) {
    for (int64_t n : kLengths) {
      if (n == 0) continue;
      std::vector<float> x = Random(n, std::pow(10.f, log_mag(rng_)));
      if (values % 7 == 0) x[values % n] *= 1000.f;  // an outlier sets the scale
      if (values % 11 == 0) std::fill(x.begin(), x.end(), 0.f);
      std::vector<int8_t> qs(n), qa(n);
      const float ds = s_.quantize_kv_i8(x.data(), qs.data(), n);
      const float da = avx2_->quantize_kv_i8(x.data(), qa.data(), n);
      ASSERT_EQ(BitsFromFp32(ds), BitsFromFp32(da)) << n;
      ASSERT_EQ(qs, qa) << n;
      float amax = 0.f;
      for (float v : x) amax = std::max(amax, std::fabs(v));
      ASSERT_EQ(ds, amax / 127.f);
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_GE(qs[i], -127);
        ASSERT_NEAR(double{ds} * qs[i], x[i], 0.5 * double{ds} * 1.0001) << n << " " << i;
      }
      if (amax > 0.f) {
        // The largest magnitude maps to +-127 exactly.
        const int64_t arg = std::max_element(x.begin(), x.end(), [](float a, float b) {
                              return std::fabs(a) < std::fabs(b);
                            }) - x.begin();
        ASSERT_EQ(std::abs(int{qs[arg]}), 127);
      } else {
        ASSERT_EQ(qs, std::vector<int8_t>(n, 0));
      }
      values += n;
    }
  }
  // Ties round half to even in both tables: 0.5, 1.5, 2.5 steps -> 0, 2, 2.
  std::vector<float> ties = {127.f, 0.5f, 1.5f, 2.5f, -0.5f, -1.5f, -2.5f, 3.f};
  ties.resize(40, 0.25f);
  std::vector<int8_t> qs(ties.size()), qa(ties.size());
  EXPECT_EQ(s_.quantize_kv_i8(ties.data(), qs.data(), ties.size()), 1.f);
  EXPECT_EQ(avx2_->quantize_kv_i8(ties.data(), qa.data(), ties.size()), 1.f);
  EXPECT_EQ(qs, qa);
  EXPECT_EQ(std::vector<int8_t>(qs.begin(), qs.begin() + 8),
            (std::vector<int8_t>{127, 0, 2, 2, 0, -2, -2, 3}));
}

// The INT8 KV rotation: both tables give the bits of the reference loops in kv_rotation.h (the
// AVX2 one does the first three butterfly stages in registers) for every block size, both scales
// (into the stored basis and back), magnitudes from 1e-30 to 1e30 and rows with one outlier.
TEST_F(KernelsTest, RotateKvRowBitExactWithTheReference) {
  std::uniform_real_distribution<float> log_mag(-30.f, 30.f);
  int rows = 0;
  for (int hd : {1, 2, 3, 4, 6, 8, 12, 16, 24, 40, 64, 80, 96, 112, 128, 160, 192, 256, 512}) {
    const float in_scale = 1.f / static_cast<float>(KvRotationBlock(hd));
    for (int rep = 0; rep < 200; ++rep, ++rows) {
      std::vector<float> x = Random(hd, std::pow(10.f, log_mag(rng_)));
      if (rep % 7 == 0) x[rep % hd] *= 1000.f;
      for (float scale : {in_scale, 1.f}) {
        std::vector<float> want = x, got_s = x, got_a = x;
        RotateKvRow(want.data(), hd, scale);
        s_.rotate_kv_row(got_s.data(), hd, scale);
        avx2_->rotate_kv_row(got_a.data(), hd, scale);
        for (int i = 0; i < hd; ++i) {
          ASSERT_EQ(BitsFromFp32(got_s[i]), BitsFromFp32(want[i])) << hd << " " << i;
          ASSERT_EQ(BitsFromFp32(got_a[i]), BitsFromFp32(want[i])) << hd << " " << i;
        }
      }
    }
  }
  EXPECT_EQ(rows, 19 * 200);
}

// F16 rows into the INT8 scheme in one call: both tables give the bits of F16 -> F32, the
// reference rotation and quantize_kv_i8, for head dims the AVX-512 one-pass kernel takes (64, 128,
// 256) and those it leaves to the three kernels, over the whole F16 range: zeros, subnormal halves,
// the largest ones, and rows with one outlier.
TEST_F(KernelsTest, QuantizeKvI8F16BitExactWithTheComposition) {
  int fused_dims = 0;
  for (int hd : {1, 8, 16, 24, 32, 64, 80, 96, 128, 192, 256, 512}) {
    if (Avx512KvRowF16ToI8(hd) != nullptr) ++fused_dims;
    for (int rep = 0; rep < 300; ++rep) {
      std::vector<uint16_t> x(hd);
      std::uniform_int_distribution<int> bits(0, 0xffff);
      for (uint16_t& h : x) {
        h = static_cast<uint16_t>(bits(rng_));
        if ((h & 0x7c00) == 0x7c00) h &= 0xbbff;  // finite values only (kernels.h)
        if (rep % 5 == 1) h &= 0x83ff;            // subnormal halves
      }
      if (rep % 7 == 2) x[rep % hd] = 0x7bff;  // the largest half
      if (rep % 11 == 3) std::fill(x.begin(), x.end(), 0);
      std::vector<float> want_x(hd), tmp(hd);
      ScalarKernels().f16_to_f32(x.data(), want_x.data(), hd);
      RotateKvRow(want_x.data(), hd, 1.f / static_cast<float>(KvRotationBlock(hd)));
      std::vector<int8_t> want_q(hd), qs(hd), qa(hd);
      const float want = s_.quantize_kv_i8(want_x.data(), want_q.data(), hd);
      const float ds = s_.quantize_kv_i8_f16(x.data(), tmp.data(), qs.data(), hd);
      const float da = avx2_->quantize_kv_i8_f16(x.data(), tmp.data(), qa.data(), hd);
      ASSERT_EQ(BitsFromFp32(ds), BitsFromFp32(want)) << hd << " rep " << rep;
      ASSERT_EQ(BitsFromFp32(da), BitsFromFp32(want)) << hd << " rep " << rep;
      ASSERT_EQ(qs, want_q) << hd << " rep " << rep;
      ASSERT_EQ(qa, want_q) << hd << " rep " << rep;
    }
  }
  if (CpuHasAvx512(bit_AVX512F | bit_AVX512BW)) {  // the CPU's, under PDSERVE_CPU_ISA's cap
    EXPECT_EQ(fused_dims, 3);  // 64, 128, 256 took the one-pass kernel
  }
}

// INT8 rows back to F16 in one call: both tables give the bits of q * scale in F32, the
// reference rotation (scale 1) and F32 -> F16, for the AVX-512 one-pass head dims (64, 128, 256)
// and the others, scales from 1e-9 to 300 (F16 overflow to inf included) and 0.
TEST_F(KernelsTest, DequantizeKvI8F16BitExactWithTheComposition) {
  std::uniform_int_distribution<int> qd(-127, 127);
  std::uniform_real_distribution<float> log_scale(-9.f, 2.5f);
  int fused_dims = 0;
  for (int hd : {1, 8, 16, 24, 32, 64, 80, 96, 128, 192, 256, 512}) {
    if (Avx512KvRowI8ToF16(hd) != nullptr) ++fused_dims;
    for (int rep = 0; rep < 300; ++rep) {
      std::vector<int8_t> q(hd);
      for (int8_t& v : q) v = static_cast<int8_t>(qd(rng_));
      const float scale = rep % 13 == 0 ? 0.f : std::pow(10.f, log_scale(rng_));
      std::vector<float> x(hd), tmp(hd);
      for (int i = 0; i < hd; ++i) x[i] = scale * static_cast<float>(q[i]);
      RotateKvRow(x.data(), hd, 1.f);
      std::vector<uint16_t> want(hd), ys(hd), ya(hd);
      ScalarKernels().f32_to_f16(x.data(), want.data(), hd);
      s_.dequantize_kv_i8_f16(q.data(), scale, tmp.data(), ys.data(), hd);
      avx2_->dequantize_kv_i8_f16(q.data(), scale, tmp.data(), ya.data(), hd);
      ASSERT_EQ(ys, want) << hd << " rep " << rep;
      ASSERT_EQ(ya, want) << hd << " rep " << rep;
    }
  }
  if (CpuHasAvx512(bit_AVX512F | bit_AVX512BW)) {  // the CPU's, under PDSERVE_CPU_ISA's cap
    EXPECT_EQ(fused_dims, 3);
  }
}

TEST_F(KernelsTest, Int8AttentionRowKernels) {
  std::uniform_int_distribution<int> qd(-127, 127);
  for (int64_t n : kLengths) {
    std::vector<int8_t> a(n);
    for (int8_t& v : a) v = static_cast<int8_t>(qd(rng_));
    std::vector<float> b = Random(n);
    double ref = 0, abs_sum = 0;
    for (int64_t i = 0; i < n; ++i) {
      ref += static_cast<double>(a[i]) * b[i];
      abs_sum += std::fabs(static_cast<double>(a[i]) * b[i]);
    }
    const double tol = 8 * std::sqrt(double(n)) * 0x1p-24 * abs_sum + 1e-30;
    EXPECT_NEAR(s_.dot_i8_f32(a.data(), b.data(), n), ref, tol) << n;
    EXPECT_NEAR(avx2_->dot_i8_f32(a.data(), b.data(), n), ref, tol) << n;
    const float alpha = 0.0037f;
    std::vector<float> ys = b, ya = b;
    s_.axpy_i8(alpha, a.data(), ys.data(), n);
    avx2_->axpy_i8(alpha, a.data(), ya.data(), n);
    for (int64_t i = 0; i < n; ++i) {
      const double r = b[i] + double{alpha} * a[i];
      const double t = 0x1p-23 * (std::fabs(b[i]) + std::fabs(alpha * a[i])) + 1e-38;
      ASSERT_NEAR(ys[i], r, t) << n << " " << i;
      ASSERT_NEAR(ya[i], r, t) << n << " " << i;
    }
    std::vector<float> ws(n, -1.f), wa(n, -1.f);
    s_.widen_i8(a.data(), ws.data(), n);
    avx2_->widen_i8(a.data(), wa.data(), n);
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(ws[i], static_cast<float>(a[i])) << n << " " << i;
      ASSERT_EQ(wa[i], static_cast<float>(a[i])) << n << " " << i;
    }
  }
}

TEST_F(KernelsTest, ExactRowOps) {
  for (int64_t n : kLengths) {
    const std::vector<float> a = Random(n), b = Random(n);
    std::vector<float> ys(n), ya(n);
    s_.add(a.data(), b.data(), ys.data(), n);
    avx2_->add(a.data(), b.data(), ya.data(), n);
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(ys[i], a[i] + b[i]);
    ASSERT_EQ(ys, ya);
    s_.scale(a.data(), 1.7f, ys.data(), n);
    avx2_->scale(a.data(), 1.7f, ya.data(), n);
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(ys[i], 1.7f * a[i]);
    ASSERT_EQ(ys, ya);
    s_.scale_mul(a.data(), 0.3f, b.data(), ys.data(), n);
    avx2_->scale_mul(a.data(), 0.3f, b.data(), ya.data(), n);
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(ys[i], (0.3f * a[i]) * b[i]);
    ASSERT_EQ(ys, ya);
    // In place.
    std::vector<float> in_place = a;
    avx2_->scale(in_place.data(), 1.7f, in_place.data(), n);
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(in_place[i], 1.7f * a[i]);

    std::vector<float> m = a;
    if (n > 2) m[n - 1] = 100.f;  // max in the scalar tail
    if (n > 9) m[3] = 200.f;
    float want = -std::numeric_limits<float>::infinity();
    for (float v : m) want = std::max(want, v);
    EXPECT_EQ(s_.max(m.data(), n), want);
    EXPECT_EQ(avx2_->max(m.data(), n), want);

    double ss = 0;
    for (float v : a) ss += double{v * v};
    EXPECT_NEAR(s_.sum_squares(a.data(), n), ss, 1e-12 * (ss + 1));
    EXPECT_NEAR(avx2_->sum_squares(a.data(), n), ss, 1e-12 * (ss + 1));
  }
}

TEST_F(KernelsTest, ExpBasedRowOps) {
  for (int64_t n : kLengths) {
    std::vector<float> g(n), u = Random(n);
    std::uniform_real_distribution<float> wide(-100.f, 100.f);
    for (float& v : g) v = wide(rng_);
    if (n > 5) g[1] = -88.5f, g[2] = 88.5f, g[3] = 0.f, g[4] = -1e-30f;
    std::vector<float> ys(n), ya(n);
    s_.swiglu(g.data(), u.data(), ys.data(), n);
    avx2_->swiglu(g.data(), u.data(), ya.data(), n);
    for (int64_t i = 0; i < n; ++i) {
      const double r = g[i] / (1 + std::exp(-double{g[i]})) * u[i];
      ASSERT_NEAR(ys[i], r, 1e-6 * std::fabs(r) + 1e-30) << "g=" << g[i];
      ASSERT_NEAR(ya[i], r, 1e-6 * std::fabs(r) + 1e-30) << "g=" << g[i];
    }

    // exp(x - m) over a softmax-like range, with masked (-inf) entries.
    std::vector<float> x(n);
    std::uniform_real_distribution<float> logits(-95.f, 5.f);
    for (float& v : x) v = logits(rng_);
    if (n > 3) x[2] = -std::numeric_limits<float>::infinity();
    const float m = 5.f;
    double want_sum = 0;
    std::vector<double> want(n);
    // The kernels subtract in F32; the reference exponentiates that same difference.
    for (int64_t i = 0; i < n; ++i) want_sum += want[i] = std::exp(double{x[i] - m});
    std::vector<float> es(n), ea(n);
    const double ss = s_.exp_sub_sum(x.data(), m, es.data(), n);
    const double sa = avx2_->exp_sub_sum(x.data(), m, ea.data(), n);
    for (int64_t i = 0; i < n; ++i) {
      // Below e^-87.3 the AVX2 exp flushes to zero: allow that absolute error.
      ASSERT_NEAR(es[i], want[i], 1e-6 * want[i] + 1e-38) << "x=" << x[i];
      ASSERT_NEAR(ea[i], want[i], 1e-6 * want[i] + 1.2e-38) << "x=" << x[i];
    }
    EXPECT_NEAR(ss, want_sum, 1e-6 * want_sum + 1e-36);
    EXPECT_NEAR(sa, want_sum, 1e-6 * want_sum + 1e-36);
  }
}

}  // namespace

// ---- attention and RoPE in ggml's order ------------------------------------------------------

// Random finite floats of mixed magnitudes, some -inf (masked positions) and some far below the
// others, so that ggml's expf takes its near-range and out-of-range branches too.
std::vector<float> AttnScores(std::mt19937& rng, int64_t n) {
  std::normal_distribution<float> normal(0.f, 4.f);
  std::uniform_int_distribution<int> kind(0, 19);
  std::vector<float> x(n);
  for (float& v : x) {
    const int c = kind(rng);
    v = c == 0 ? -std::numeric_limits<float>::infinity()
               : c == 1 ? -90.f - 100.f * std::fabs(normal(rng))
                        : c == 2 ? -150.f + normal(rng) : normal(rng);
  }
  return x;
}

void ExpectAttnKernelsEqual(const AttnKernels& ref, const AttnKernels& simd) {
  ASSERT_EQ(ref.lanes, simd.lanes);
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.f, 1.f);
  for (int64_t n : {1, 20, 64, 100, 128, 256, 300}) {
    std::vector<float> a(n), b(n);
    for (float& v : a) v = normal(rng);
    for (float& v : b) v = normal(rng) * 3.f;
    const float r = ref.dot(a.data(), b.data(), n), s = simd.dot(a.data(), b.data(), n);
    EXPECT_EQ(std::bit_cast<uint32_t>(r), std::bit_cast<uint32_t>(s)) << "dot n " << n;
  }
  for (int64_t groups : {1, 2, 7, 33}) {
    const int64_t n = groups * ref.lanes;
    const std::vector<float> x = AttnScores(rng, n);
    const float m = 2.5f;
    std::vector<float> yr(n), ys(n);
    const double sr = ref.exp_sum(x.data(), m, yr.data(), n);
    const double ss = simd.exp_sum(x.data(), m, ys.data(), n);
    EXPECT_EQ(std::bit_cast<uint64_t>(sr), std::bit_cast<uint64_t>(ss)) << "exp_sum n " << n;
    ASSERT_EQ(std::memcmp(yr.data(), ys.data(), n * sizeof(float)), 0) << "exp n " << n;
    for (int64_t i = 0; i < n; ++i) {
      if (std::isinf(x[i])) {
        ASSERT_EQ(yr[i], 0.f);
      }
      // ggml's expf is within a few ulp of the true value in range.
      const double e = std::exp(static_cast<double>(x[i] - m));  // ggml's argument is F32 x - m
      if (x[i] - m > -80.f) {
        ASSERT_NEAR(yr[i], e, 4e-7 * e);
      }
    }
  }
  for (int rows : {1, ref.lanes, 4 * ref.lanes}) {
    for (int64_t cols : {1, 7, 16, 20, 256}) {
      std::vector<float> acc(rows * (cols + 3));
      for (float& v : acc) v = normal(rng);
      std::vector<float> outr(cols), outs(cols);
      ref.reduce(acc.data(), rows, cols + 3, cols, outr.data());
      simd.reduce(acc.data(), rows, cols + 3, cols, outs.data());
      ASSERT_EQ(std::memcmp(outr.data(), outs.data(), cols * sizeof(float)), 0)
          << "reduce rows " << rows << " cols " << cols;
      for (int64_t c = 0; c < cols; ++c) {
        double sum = 0;
        for (int r = 0; r < rows; ++r) sum += acc[r * (cols + 3) + c];
        ASSERT_NEAR(outr[c], sum, 1e-5);
      }
    }
  }
  // vsum: positions lo..hi (not aligned to the lanes), every accumulator count, any width; one
  // accumulator is one FMA chain per column, the positions in order (pv_gemm's).
  for (int n_acc : {1, ref.lanes, 4 * ref.lanes}) {
    for (auto [lo, hi] : {std::pair<int64_t, int64_t>{0, 0}, {3, 40}, {17, 300}, {64, 127}}) {
      for (int64_t cols : {7, 16, 20, 256}) {
        const int64_t len = hi - lo + 1;
        std::vector<float> p(len), vals(len * cols);
        for (float& x : p) x = std::fabs(normal(rng));
        for (float& x : vals) x = normal(rng);
        std::vector<const float*> rows(len);
        for (int64_t j = 0; j < len; ++j) rows[j] = vals.data() + j * cols;
        std::vector<float> outr(cols), outs(cols);
        ref.vsum(p.data(), rows.data(), lo, hi, n_acc, cols, outr.data());
        simd.vsum(p.data(), rows.data(), lo, hi, n_acc, cols, outs.data());
        ASSERT_EQ(std::memcmp(outr.data(), outs.data(), cols * sizeof(float)), 0)
            << "vsum n_acc " << n_acc << " lo " << lo << " hi " << hi << " cols " << cols;
        if (n_acc == 1) {
          for (int64_t c = 0; c < cols; ++c) {
            float chain = 0.f;
            for (int64_t j = 0; j < len; ++j) chain = std::fma(p[j], vals[j * cols + c], chain);
            ASSERT_EQ(std::bit_cast<uint32_t>(outs[c]), std::bit_cast<uint32_t>(chain))
                << "vsum chain lo " << lo << " col " << c;
          }
        }
        for (int64_t c = 0; c < cols; ++c) {
          double sum = 0;
          for (int64_t j = 0; j < len; ++j) sum += double(p[j]) * vals[j * cols + c];
          ASSERT_NEAR(outr[c], sum, 1e-4);
        }
      }
    }
  }
}

// The batched entries against the single ones of the same table (their contract) and against
// the scalar table: dots for 1..6 query heads (the SIMD kernels take heads four or two at a
// time), key runs that leave partial lane groups, head_dims with and without tails, keys far apart
// in magnitude (big cancellations, so any change in the order of the adds shows) and near
// FLT_MAX / FLT_MIN; vsums for positions not aligned to the accumulators, both accumulator
// counts and widths that leave partial chunks.
void ExpectBatchedAttnKernelsEqual(const AttnKernels& ref, const AttnKernels& simd) {
  ASSERT_EQ(ref.lanes, simd.lanes);
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::uniform_int_distribution<int> kind(0, 9);
  auto value = [&](float big) {
    const int c = kind(rng);
    return c == 0 ? normal(rng) * big : c == 1 ? normal(rng) * 1e-30f : normal(rng);
  };
  for (int64_t n : {1, 7, 32, 63, 64, 65, 100, 128, 200, 256, 300}) {
    for (int n_q : {1, 2, 3, 4, 5, 6}) {
      for (int n_k : {1, 5, 8, 15, 16, 17, 40}) {
        // Magnitudes up to 2^60 per product term stay far from overflow in any order of sums.
        const float big = (n_k + n_q) % 3 == 0 ? 1e15f : 1e4f;
        const int64_t q_stride = n + 3, out_stride = n_k + 2;
        std::vector<float> q(n_q * q_stride), keys(n_k * (n + 1));
        for (float& x : q) x = value(big);
        for (float& x : keys) x = value(big);
        std::vector<const float*> k(n_k);
        for (int j = 0; j < n_k; ++j) k[j] = keys.data() + j * (n + 1);
        std::vector<float> outr(n_q * out_stride, -1.f), outs(n_q * out_stride, -1.f);
        ref.dots(q.data(), q_stride, n_q, k.data(), n_k, n, outr.data(), out_stride);
        simd.dots(q.data(), q_stride, n_q, k.data(), n_k, n, outs.data(), out_stride);
        for (int g = 0; g < n_q; ++g) {
          for (int j = 0; j < out_stride; ++j) {
            const float single = j < n_k ? simd.dot(k[j], q.data() + g * q_stride, n) : -1.f;
            const float r = outr[g * out_stride + j], s = outs[g * out_stride + j];
            ASSERT_EQ(std::bit_cast<uint32_t>(r), std::bit_cast<uint32_t>(s))
                << "dots n " << n << " n_q " << n_q << " n_k " << n_k << " g " << g << " j " << j;
            ASSERT_EQ(std::bit_cast<uint32_t>(single), std::bit_cast<uint32_t>(s))
                << "dots vs dot n " << n << " n_q " << n_q << " n_k " << n_k << " g " << g << " j "
                << j;
          }
        }
      }
    }
  }
  // F16 keys (values within F16's range): the F16 entry equals dots on the widened rows.
  for (int64_t n : {1, 40, 64, 100, 128, 256, 300}) {
    for (int n_q : {1, 2, 3, 4, 5}) {
      for (int n_k : {1, 9, 16, 33}) {
        std::vector<float> q(n_q * n);
        for (float& x : q) x = value(1e4f);
        std::vector<uint16_t> k16(n_k * n);
        std::vector<float> kw(n_k * n);
        for (size_t i = 0; i < k16.size(); ++i) {
          k16[i] = F32ToF16(value(100.f));
          kw[i] = F16ToF32(k16[i]);
        }
        std::vector<const uint16_t*> k(n_k);
        std::vector<const float*> kf(n_k);
        for (int j = 0; j < n_k; ++j) k[j] = k16.data() + j * n, kf[j] = kw.data() + j * n;
        std::vector<float> outr(n_q * n_k), outs(n_q * n_k), outw(n_q * n_k);
        ref.dots_f16(q.data(), n, n_q, k.data(), n_k, n, outr.data(), n_k);
        simd.dots_f16(q.data(), n, n_q, k.data(), n_k, n, outs.data(), n_k);
        simd.dots(q.data(), n, n_q, kf.data(), n_k, n, outw.data(), n_k);
        ASSERT_EQ(std::memcmp(outr.data(), outs.data(), outr.size() * sizeof(float)), 0)
            << "dots_f16 n " << n << " n_q " << n_q << " n_k " << n_k;
        ASSERT_EQ(std::memcmp(outw.data(), outs.data(), outr.size() * sizeof(float)), 0)
            << "dots_f16 vs dots n " << n << " n_q " << n_q << " n_k " << n_k;
      }
    }
  }
  // Near the ends of the float range: products near FLT_MAX / 16 (sums stay finite) and
  // subnormal products.
  for (float mag : {1.8e18f, 1e-22f}) {
    const int64_t n = 256;
    std::vector<float> q(4 * n), keys(16 * n);
    for (float& x : q) x = normal(rng) * mag;
    for (float& x : keys) x = normal(rng);
    keys[5] = 0.f;
    std::vector<const float*> k(16);
    for (int j = 0; j < 16; ++j) k[j] = keys.data() + j * n;
    std::vector<float> outr(4 * 16), outs(4 * 16);
    ref.dots(q.data(), n, 4, k.data(), 16, n, outr.data(), 16);
    simd.dots(q.data(), n, 4, k.data(), 16, n, outs.data(), 16);
    ASSERT_EQ(std::memcmp(outr.data(), outs.data(), outr.size() * sizeof(float)), 0)
        << "dots magnitude " << mag;
  }
  for (int n_acc : {1, ref.lanes, 4 * ref.lanes}) {
    for (auto [lo, hi] :
         {std::pair<int64_t, int64_t>{0, 0}, {3, 40}, {17, 300}, {64, 127}, {5, 1000}}) {
      for (int64_t cols : {7, 16, 20, 40, 64, 72, 256}) {
        for (int n_q : {1, 2, 3, 4, 5}) {
          const int64_t len = hi - lo + 1, p_stride = len + 5, out_stride = cols + 1;
          std::vector<float> p(n_q * p_stride), vals(len * cols);
          for (float& x : p) x = std::fabs(normal(rng));
          for (float& x : vals) x = value(1e6f);
          std::vector<const float*> rows(len);
          for (int64_t j = 0; j < len; ++j) rows[j] = vals.data() + j * cols;
          std::vector<float> outr(n_q * out_stride, -1.f), outs(n_q * out_stride, -1.f);
          ref.vsums(p.data(), p_stride, n_q, rows.data(), lo, hi, n_acc, cols, outr.data(),
                    out_stride);
          simd.vsums(p.data(), p_stride, n_q, rows.data(), lo, hi, n_acc, cols, outs.data(),
                     out_stride);
          ASSERT_EQ(std::memcmp(outr.data(), outs.data(), outr.size() * sizeof(float)), 0)
              << "vsums n_acc " << n_acc << " lo " << lo << " hi " << hi << " cols " << cols
              << " n_q " << n_q;
          // The same positions as F16 rows (values rounded to F16 first).
          std::vector<uint16_t> v16(len * cols);
          std::vector<float> vw(len * cols);
          for (size_t i = 0; i < v16.size(); ++i) {
            v16[i] = F32ToF16(std::clamp(vals[i], -6e4f, 6e4f));
            vw[i] = F16ToF32(v16[i]);
          }
          std::vector<const uint16_t*> rows16(len);
          std::vector<const float*> rowsw(len);
          for (int64_t j = 0; j < len; ++j) {
            rows16[j] = v16.data() + j * cols;
            rowsw[j] = vw.data() + j * cols;
          }
          std::vector<float> outr16(outr.size()), outs16(outr.size()), outw(outr.size());
          ref.vsums_f16(p.data(), p_stride, n_q, rows16.data(), lo, hi, n_acc, cols, outr16.data(),
                        out_stride);
          simd.vsums_f16(p.data(), p_stride, n_q, rows16.data(), lo, hi, n_acc, cols, outs16.data(),
                         out_stride);
          simd.vsums(p.data(), p_stride, n_q, rowsw.data(), lo, hi, n_acc, cols, outw.data(),
                     out_stride);
          ASSERT_EQ(std::memcmp(outr16.data(), outs16.data(), outr.size() * sizeof(float)), 0)
              << "vsums_f16 n_acc " << n_acc << " lo " << lo << " hi " << hi << " cols " << cols
              << " n_q " << n_q;
          ASSERT_EQ(std::memcmp(outw.data(), outs16.data(), outr.size() * sizeof(float)), 0)
              << "vsums_f16 vs vsums n_acc " << n_acc << " lo " << lo << " hi " << hi << " cols "
              << cols << " n_q " << n_q;
          std::vector<float> single(cols);
          for (int g = 0; g < n_q; ++g) {
            simd.vsum(p.data() + g * p_stride, rows.data(), lo, hi, n_acc, cols, single.data());
            ASSERT_EQ(
                std::memcmp(single.data(), outs.data() + g * out_stride, cols * sizeof(float)), 0)
                << "vsums vs vsum n_acc " << n_acc << " lo " << lo << " hi " << hi << " cols "
                << cols << " g " << g;
          }
        }
      }
    }
  }
}

// vsums_rows (a prompt's rows against the same V rows, each row its own range) against the
// table's vsums row by row and against `ref`'s vsums_rows: 1..9 rows of 1..5 heads with
// overlapping, nested, disjoint and equal ranges (causal rows, sliding windows), rows not in
// position order, every accumulator count (1: one chain), widths with partial chunks, F32 and F16
// rows. The position just before each row's range holds +inf: a zero weight given to it would turn
// the row's sums into NaN.
void ExpectVSumsRowsEqual(const AttnKernels& ref, const AttnKernels& simd) {
  ASSERT_EQ(ref.lanes, simd.lanes);
  std::mt19937 rng(23);
  std::normal_distribution<float> normal(0.f, 1.f);
  for (int trial = 0; trial < 120; ++trial) {
    const int n_rows = 1 + trial % 9, n_q = 1 + trial % 5;
    const int n_acc = std::array<int, 3>{1, ref.lanes, 4 * ref.lanes}[trial / 9 % 3];
    const int64_t cols = std::array<int64_t, 5>{7, 16, 40, 64, 256}[trial / 2 % 5];
    const int64_t base = std::uniform_int_distribution<int64_t>(0, 40)(rng);
    std::vector<int64_t> lo(n_rows), hi(n_rows);
    const int shape = trial / 10 % 4;  // causal, window, random, equal
    const int64_t window = std::uniform_int_distribution<int64_t>(1, 60)(rng);
    for (int r = 0; r < n_rows; ++r) {
      const int64_t pos = base + std::uniform_int_distribution<int64_t>(0, 300)(rng);
      hi[r] = shape == 3 ? base + 200 : pos;
      lo[r] = shape == 0 || shape == 3 ? base
              : shape == 1             ? std::max(base, pos - window + 1)
                                       : std::uniform_int_distribution<int64_t>(base, pos)(rng);
    }
    int64_t hi_max = base;
    for (int r = 0; r < n_rows; ++r) hi_max = std::max(hi_max, hi[r]);
    const int64_t len = hi_max - base + 1, p_stride = len + 3, out_stride = cols + 2;
    std::vector<float> vals(len * cols), probs(n_rows * n_q * p_stride);
    for (float& x : vals) x = normal(rng) * (normal(rng) > 2.f ? 1e6f : 1.f);
    for (float& x : probs) x = std::fabs(normal(rng));
    bool inf_row = false;
    for (int r = 0; r < n_rows; ++r) {
      if (lo[r] > base) vals[(lo[r] - 1 - base) * cols] = INFINITY, inf_row = true;
    }
    std::vector<int64_t> inf_at;
    for (int64_t j = 0; j < len; ++j) {
      if (std::isinf(vals[j * cols])) inf_at.push_back(base + j);
    }
    std::vector<const float*> rows(len);
    for (int64_t j = 0; j < len; ++j) rows[j] = vals.data() + j * cols;
    std::vector<const float*> p(n_rows);
    for (int r = 0; r < n_rows; ++r) p[r] = probs.data() + r * n_q * p_stride;
    // The same positions as F16 rows (values rounded to F16 first; +inf stays).
    std::vector<uint16_t> v16(len * cols);
    std::vector<float> vw(len * cols);
    for (size_t i = 0; i < v16.size(); ++i) {
      v16[i] = F32ToF16(std::isinf(vals[i]) ? vals[i] : std::clamp(vals[i], -6e4f, 6e4f));
      vw[i] = F16ToF32(v16[i]);
    }
    std::vector<const uint16_t*> rows16(len);
    std::vector<const float*> rowsw(len);
    for (int64_t j = 0; j < len; ++j)
      rows16[j] = v16.data() + j * cols, rowsw[j] = vw.data() + j * cols;
    const size_t out_size = static_cast<size_t>(n_rows * n_q * out_stride);
    auto outs_of = [&](std::vector<float>& o) {
      std::vector<float*> ptrs(n_rows);
      for (int r = 0; r < n_rows; ++r) ptrs[r] = o.data() + r * n_q * out_stride;
      return ptrs;
    };
    std::vector<float> outr(out_size, -1.f), outs(out_size, -1.f), single(out_size, -1.f);
    std::vector<float> outr16(out_size, -1.f), outs16(out_size, -1.f), single16(out_size, -1.f);
    ref.vsums_rows(p.data(), p_stride, n_q, n_rows, rows.data(), base, lo.data(), hi.data(), n_acc,
                   cols, outs_of(outr).data(), out_stride);
    simd.vsums_rows(p.data(), p_stride, n_q, n_rows, rows.data(), base, lo.data(), hi.data(), n_acc,
                    cols, outs_of(outs).data(), out_stride);
    ref.vsums_rows_f16(p.data(), p_stride, n_q, n_rows, rows16.data(), base, lo.data(), hi.data(),
                       n_acc, cols, outs_of(outr16).data(), out_stride);
    simd.vsums_rows_f16(p.data(), p_stride, n_q, n_rows, rows16.data(), base, lo.data(), hi.data(),
                        n_acc, cols, outs_of(outs16).data(), out_stride);
    for (int r = 0; r < n_rows; ++r) {
      float* o = single.data() + r * n_q * out_stride;
      simd.vsums(p[r], p_stride, n_q, rows.data() + (lo[r] - base), lo[r], hi[r], n_acc, cols, o,
                 out_stride);
      simd.vsums(p[r], p_stride, n_q, rowsw.data() + (lo[r] - base), lo[r], hi[r], n_acc, cols,
                 single16.data() + r * n_q * out_stride, out_stride);
      bool sees_inf = false;
      for (int64_t j : inf_at) sees_inf |= j >= lo[r] && j <= hi[r];
      for (int g = 0; g < n_q && !sees_inf; ++g) {
        for (int64_t c = 0; c < cols; ++c) {
          ASSERT_TRUE(std::isfinite(outs[(r * n_q + g) * out_stride + c]))
              << "trial " << trial << " row " << r << " head " << g << " col " << c;
        }
      }
    }
    const std::string what = "trial " + std::to_string(trial) + " rows " + std::to_string(n_rows) +
                             " n_q " + std::to_string(n_q) + " cols " + std::to_string(cols) +
                             " n_acc " + std::to_string(n_acc) +
                             (inf_row ? " (+inf before a range)" : "");
    ASSERT_EQ(std::memcmp(outr.data(), outs.data(), out_size * sizeof(float)), 0) << what;
    ASSERT_EQ(std::memcmp(single.data(), outs.data(), out_size * sizeof(float)), 0) << what;
    ASSERT_EQ(std::memcmp(outr16.data(), outs16.data(), out_size * sizeof(float)), 0) << what;
    ASSERT_EQ(std::memcmp(single16.data(), outs16.data(), out_size * sizeof(float)), 0) << what;
  }
}

TEST(AttnKernelsTest, ScalarVSumsRowsMatchesVSumsRowByRow) {
  ExpectVSumsRowsEqual(ScalarAttnKernels(8), ScalarAttnKernels(8));
  ExpectVSumsRowsEqual(ScalarAttnKernels(16), ScalarAttnKernels(16));
}

TEST(AttnKernelsTest, Avx2VSumsRowsMatchesTheScalarOne) {
  if (Avx2Kernels() == nullptr || &SelectKernels(false) != Avx2Kernels()) {
    GTEST_SKIP() << "AVX2 kernels not available on this build/CPU";
  }
  ExpectVSumsRowsEqual(ScalarAttnKernels(8), Avx2AttnKernels());
}

TEST(AttnKernelsTest, Avx512VSumsRowsMatchesTheScalarOne) {
  const AttnKernels* k = Avx512AttnKernels();
  if (k == nullptr) GTEST_SKIP() << "no AVX512F + AVX512DQ on this CPU";
  ExpectVSumsRowsEqual(ScalarAttnKernels(16), *k);
}

TEST(AttnKernelsTest, ScalarBatchedEntriesMatchTheSingleOnes) {
  ExpectBatchedAttnKernelsEqual(ScalarAttnKernels(8), ScalarAttnKernels(8));
  ExpectBatchedAttnKernelsEqual(ScalarAttnKernels(16), ScalarAttnKernels(16));
}

TEST(AttnKernelsTest, Avx2BatchedEntriesMatchTheScalarOnes) {
  if (Avx2Kernels() == nullptr || &SelectKernels(false) != Avx2Kernels()) {
    GTEST_SKIP() << "AVX2 kernels not available on this build/CPU";
  }
  ExpectBatchedAttnKernelsEqual(ScalarAttnKernels(8), Avx2AttnKernels());
}

TEST(AttnKernelsTest, Avx512BatchedEntriesMatchTheScalarOnes) {
  const AttnKernels* k = Avx512AttnKernels();
  if (k == nullptr) GTEST_SKIP() << "no AVX512F + AVX512DQ on this CPU";
  ExpectBatchedAttnKernelsEqual(ScalarAttnKernels(16), *k);
}

// qk_gemm and pv_gemm (the GEMM order of prompt attention over F16 caches) against the scalar
// twins, bit for bit: head dims and column counts that leave every SIMD tail (1..300), 1..14
// queries (whole micro-tiles and every remainder), key ranges that start and end inside a block,
// position runs past the 64-position step. Key blocks' unused lanes hold NaN: they must not leak
// into stored scores. pv_gemm over [0, n) must equal pv_gemm over [0, a) then [a, n): each
// output is one chain in position order, however the positions are cut.
void ExpectGemmOrderEqual(const AttnKernels& ref, const AttnKernels& simd) {
  std::mt19937 rng(31);
  std::normal_distribution<float> normal(0.f, 1.f);
  auto pick = [&](std::initializer_list<int64_t> xs) {
    return *(xs.begin() + std::uniform_int_distribution<size_t>(0, xs.size() - 1)(rng));
  };
  for (int trial = 0; trial < 300; ++trial) {
    const int64_t n = pick({1, 3, 8, 15, 16, 17, 33, 64, 80, 100, 128, 256, 300});
    const int n_q = std::uniform_int_distribution<int>(1, 14)(rng);
    const int64_t first = std::uniform_int_distribution<int64_t>(0, 40)(rng);
    const int64_t n_k = std::uniform_int_distribution<int64_t>(1, 90)(rng);
    const int64_t blocks = (first + n_k + kAttnKeyBlock - 1) / kAttnKeyBlock;
    std::vector<float> kt(static_cast<size_t>(blocks * kAttnKeyBlock * n),
                          std::numeric_limits<float>::quiet_NaN());
    for (int64_t j = first; j < first + n_k; ++j) {
      for (int64_t d = 0; d < n; ++d) kt[AttnKeyBlockIndex(j, d, n)] = normal(rng);
    }
    std::vector<float> qv(static_cast<size_t>(n_q * n));
    for (float& x : qv) x = normal(rng);
    const int64_t out_stride = n_k + 3;
    std::vector<float> out_r(static_cast<size_t>(n_q * out_stride), -7.f), out_s = out_r;
    std::vector<const float*> q(n_q);
    std::vector<float*> orr(n_q), os(n_q);
    for (int m = 0; m < n_q; ++m) {
      q[m] = qv.data() + m * n;
      orr[m] = out_r.data() + m * out_stride;
      os[m] = out_s.data() + m * out_stride;
    }
    ref.qk_gemm(q.data(), n_q, kt.data(), n, first, n_k, orr.data());
    simd.qk_gemm(q.data(), n_q, kt.data(), n, first, n_k, os.data());
    const std::string what = "trial " + std::to_string(trial) + " n " + std::to_string(n) +
                             " n_q " + std::to_string(n_q) + " first " + std::to_string(first) +
                             " n_k " + std::to_string(n_k);
    for (int m = 0; m < n_q; ++m) {
      for (int64_t j = 0; j < n_k; ++j) ASSERT_TRUE(std::isfinite(out_r[m * out_stride + j])) << what;
      for (int64_t j = n_k; j < out_stride; ++j) ASSERT_EQ(out_s[m * out_stride + j], -7.f) << what;
    }
    ASSERT_EQ(std::memcmp(out_r.data(), out_s.data(), out_r.size() * sizeof(float)), 0) << what;

    // pv_gemm: n_q queries' weights over n_k positions, `cols` columns, onto random sums.
    const int64_t cols = n, v_stride = cols + 5, np = n_k + 70;
    std::vector<float> pw(static_cast<size_t>(n_q * np)), vv(static_cast<size_t>(np * v_stride));
    for (float& x : pw) x = std::fabs(normal(rng));
    for (float& x : vv) x = normal(rng);
    std::vector<float> acc_r(static_cast<size_t>(n_q * (cols + 2)));
    for (float& x : acc_r) x = normal(rng);
    std::vector<float> acc_s = acc_r, acc_split = acc_r;
    std::vector<const float*> pp(n_q);
    std::vector<float*> ar(n_q), as(n_q), asp(n_q);
    for (int m = 0; m < n_q; ++m) {
      pp[m] = pw.data() + m * np;
      ar[m] = acc_r.data() + m * (cols + 2);
      as[m] = acc_s.data() + m * (cols + 2);
      asp[m] = acc_split.data() + m * (cols + 2);
    }
    ref.pv_gemm(pp.data(), n_q, vv.data(), v_stride, np, cols, ar.data());
    simd.pv_gemm(pp.data(), n_q, vv.data(), v_stride, np, cols, as.data());
    ASSERT_EQ(std::memcmp(acc_r.data(), acc_s.data(), acc_r.size() * sizeof(float)), 0) << what;
    const int64_t cut = std::uniform_int_distribution<int64_t>(1, np - 1)(rng);
    simd.pv_gemm(pp.data(), n_q, vv.data(), v_stride, cut, cols, asp.data());
    for (int m = 0; m < n_q; ++m) pp[m] += cut;
    simd.pv_gemm(pp.data(), n_q, vv.data() + cut * v_stride, v_stride, np - cut, cols, asp.data());
    ASSERT_EQ(std::memcmp(acc_r.data(), acc_split.data(), acc_r.size() * sizeof(float)), 0)
        << what << " cut " << cut;
  }
}

TEST(AttnKernelsTest, ScalarGemmOrderIsOneChainPerOutput) {
  // The twins against the definition written out: a score is the FMA chain over d from +0.
  const AttnKernels& k = ScalarAttnKernels(16);
  const int64_t n = 5;
  std::vector<float> kt(static_cast<size_t>(kAttnKeyBlock * n), 0.f);
  const float qv[n] = {1.f, 1e8f, 1.f, -1e8f, 0.5f};
  const float key[n] = {1.f, 1.f, 3.f, 1.f, 2.f};
  for (int64_t d = 0; d < n; ++d) kt[AttnKeyBlockIndex(2, d, n)] = key[d];
  const float* q[1] = {qv};
  float s = -1.f;
  float* out[1] = {&s};
  k.qk_gemm(q, 1, kt.data(), n, 2, 1, out);
  // In order: 1, 1e8 + 1 -> 1e8, +3 -> 1e8 (lost), -1e8 -> 0, +1 -> 1.
  EXPECT_EQ(s, 1.f);
  ExpectGemmOrderEqual(ScalarAttnKernels(8), ScalarAttnKernels(16));
}

TEST(AttnKernelsTest, Avx2GemmOrderMatchesTheScalarOne) {
  if (Avx2Kernels() == nullptr || &SelectKernels(false) != Avx2Kernels()) {
    GTEST_SKIP() << "AVX2 kernels not available on this build/CPU";
  }
  ExpectGemmOrderEqual(ScalarAttnKernels(8), Avx2AttnKernels());
}

TEST(AttnKernelsTest, Avx512GemmOrderMatchesTheScalarOne) {
  const AttnKernels* k = Avx512AttnKernels();
  if (k == nullptr) GTEST_SKIP() << "no AVX512F + AVX512DQ on this CPU";
  ExpectGemmOrderEqual(ScalarAttnKernels(16), *k);
}

TEST(AttnKernelsTest, Avx2MatchesTheScalarEightLaneOrder) {
  if (Avx2Kernels() == nullptr || &SelectKernels(false) != Avx2Kernels()) {
    GTEST_SKIP() << "AVX2 kernels not available on this build/CPU";
  }
  ExpectAttnKernelsEqual(ScalarAttnKernels(8), Avx2AttnKernels());
}

TEST(AttnKernelsTest, Avx512MatchesTheScalarSixteenLaneOrder) {
  const AttnKernels* k = Avx512AttnKernels();
  if (k == nullptr) GTEST_SKIP() << "no AVX512F + AVX512DQ on this CPU";
  ExpectAttnKernelsEqual(ScalarAttnKernels(16), *k);
}

TEST(RopeKernelsTest, Avx2MatchesScalarBitForBit) {
  const Kernels* avx2 = Avx2Kernels();
  if (avx2 == nullptr || &SelectKernels(false) != avx2) {
    GTEST_SKIP() << "AVX2 kernels not available on this build/CPU";
  }
  std::mt19937 rng(9);
  std::normal_distribution<float> normal(0.f, 2.f);
  std::uniform_real_distribution<float> angle(-3.2f, 3.2f);
  // Normal mode: every fused/unfused split of RopeNormalFusedPairs (tails of 1..3 pairs).
  for (int64_t half : {1, 2, 3, 4, 5, 7, 9, 13, 15, 17, 32, 64, 128}) {
    std::vector<float> c(half), s(half), v(2 * half);
    for (int64_t i = 0; i < half; ++i) {
      const float t = angle(rng);
      c[i] = std::cos(t);
      s[i] = std::sin(t);
    }
    for (float& x : v) x = normal(rng);
    for (auto fn : {&Kernels::rope_neox, &Kernels::rope_normal}) {
      std::vector<float> a = v, b = v;
      (ScalarKernels().*fn)(a.data(), c.data(), s.data(), half);
      (avx2->*fn)(b.data(), c.data(), s.data(), half);
      ASSERT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0) << "half " << half;
      // A rotation keeps each pair's length (to rounding).
      const bool neox = fn == &Kernels::rope_neox;
      for (int64_t i = 0; i < half; ++i) {
        const int64_t i0 = neox ? i : 2 * i, i1 = neox ? i + half : 2 * i + 1;
        ASSERT_NEAR(std::hypot(a[i0], a[i1]), std::hypot(v[i0], v[i1]), 1e-5);
      }
    }
  }
}

// Which normal-mode RoPE pairs ggml fuses, as GCC vectorizes rotate_pairs (disassembly of
// llama-cpp-python's libggml-cpu, checked against ggml_rope_ext by test_matmul_sweep.py).
TEST(RopeNormalOrderTest, FusedPairsFollowGccsVectorLoops) {
  const RopeNormalWidths zmm{8, 4}, ymm{4, 2};
  const std::pair<int64_t, int64_t> want_zmm[] = {{1, 0},  {3, 0},   {4, 4},   {7, 4},  {8, 8},
                                                  {11, 8}, {12, 12}, {15, 12}, {16, 16}, {64, 64},
                                                  {65, 64}, {69, 68}};
  for (auto [half, fused] : want_zmm) EXPECT_EQ(RopeNormalFusedPairs(half, zmm), fused) << half;
  const std::pair<int64_t, int64_t> want_ymm[] = {{1, 0}, {2, 2}, {3, 2}, {4, 4},
                                                  {5, 4}, {6, 6}, {7, 6}, {64, 64}};
  for (auto [half, fused] : want_ymm) EXPECT_EQ(RopeNormalFusedPairs(half, ymm), fused) << half;
}

}  // namespace pd::engine::cpu
