// MatMul kernels for Q4_0 and Q5_0 (x Q8_0) and the k-quants Q2_K .. Q6_K (x Q8_K): the AVX2 tiles against
// their scalar twins and both against double-precision references, plus the Q8_K activation
// quantizer and MatMul through the CPU backend.
//
// References: weights expanded by the scalar DequantizeRow (k_quants.h), activations by
// DequantizeRow of their Q8_0 / Q8_K blocks, products summed in double. So the tests check what
// backend.h promises: a dot of the dequantized weights with the dequantized companion
// activations.
//
// Tolerances:
//  - Unit scales (every f16 d / dmin = 1, activation d = 1): all values are small integers, the
//    kernels' integer parts are exact and, with the absolute sum T < 2^24 (asserted), every F32
//    operation is exact too, so scalar, AVX2 and the reference must be EQUAL.
//  - Otherwise |y - ref| <= (n_blocks + 16) * 2^-24 * T, with T = sum_i (|d sc_i q_i| + |dmin
//    m_i|) |x_i|, the sum of the magnitudes of every term before cancellation (for formats
//    without mins simply sum |w_i x_i|). The kernels round once per block product and once per
//    F32 addition of a block term (sequentially in the scalar kernel, over 8 lanes in AVX2), the
//    reference's dequantization rounds each weight by a few ulps of its terms; each is bounded by
//    2^-24 T. A wrong scale, code or sub-block changes the result by ~T / (number of sub-blocks)
//    and fails by orders of magnitude.
//  - Q8_K quantization: bit-exact between the tables (codes, bsums, d).
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/status_matchers.h"
#include "engine/backend/backend.h"
#include "engine/backend/cpu/kernels.h"
#include "engine/quant/dtype.h"
#include "engine/quant/fp16.h"
#include "engine/quant/k_quants.h"
#include "engine/quant/q8_0.h"

namespace pd::engine::cpu {
namespace {

using ::pd::testing::IsOk;

struct Format {
  DType type;
  GemmType gemm;
  DType act;  // companion activation type
};

const Format kFormats[] = {
    {DType::kQ4_0, GemmType::kQ4_0, DType::kQ8_0}, {DType::kQ2_K, GemmType::kQ2_K, DType::kQ8_K},
    {DType::kQ3_K, GemmType::kQ3_K, DType::kQ8_K}, {DType::kQ4_K, GemmType::kQ4_K, DType::kQ8_K},
    {DType::kQ5_K, GemmType::kQ5_K, DType::kQ8_K}, {DType::kQ6_K, GemmType::kQ6_K, DType::kQ8_K},
    {DType::kQ5_0, GemmType::kQ5_0, DType::kQ8_0},
};

std::string Name(DType t) { return std::string(Traits(t).name); }

// Byte offsets of the f16 super-scales of a block: d first, then dmin (-1 when absent).
struct ScaleFields {
  int d, dmin;
};
ScaleFields FieldsOf(DType t) {
  switch (t) {
    case DType::kQ4_0: return {0, -1};
    case DType::kQ5_0: return {0, -1};
    case DType::kQ2_K: return {80, 82};
    case DType::kQ3_K: return {108, -1};
    case DType::kQ4_K: return {0, 2};
    case DType::kQ5_K: return {0, 2};
    case DType::kQ6_K: return {208, -1};
    case DType::kQ8_0: return {0, -1};
    default: break;
  }
  ADD_FAILURE() << "no scale fields for " << Name(t);
  return {0, -1};
}

void PutF16(char* p, uint16_t h) { std::memcpy(p, &h, 2); }
uint16_t GetF16(const char* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return h;
}

// Rows of one type: raw bytes, their dequantized values, and per element the magnitude of the
// terms that make it up (|d sc q| + |dmin m|), for the tolerance.
struct Rows {
  DType type;
  int rows = 0;
  int64_t k = 0;
  size_t stride = 0;
  std::vector<char> bytes;
  std::vector<double> values, magnitude;  // [rows, k]

  char* row(int r) { return bytes.data() + r * stride; }
  const char* row(int r) const { return bytes.data() + r * stride; }
};

Rows MakeEmpty(DType type, int rows, int64_t k) {
  Rows r;
  r.type = type;
  r.rows = rows;
  r.k = k;
  r.stride = RowBytes(type, k);
  r.bytes.assign(r.stride * rows + 64, 0);
  return r;
}

// Fills values/magnitude from the bytes, through the scalar reference dequantizer.
void Expand(Rows& r) {
  r.values.assign(r.rows * r.k, 0.0);
  r.magnitude.assign(r.rows * r.k, 0.0);
  std::vector<float> tmp(r.k);
  const DTypeTraits& tr = Traits(r.type);
  const bool has_min = r.type != DType::kQ8_K && FieldsOf(r.type).dmin >= 0;
  std::vector<char> abs_row(r.stride);
  for (int i = 0; i < r.rows; ++i) {
    DequantizeRow(r.type, r.row(i), tmp.data(), r.k);
    for (int64_t j = 0; j < r.k; ++j) r.values[i * r.k + j] = tmp[j];
    if (has_min) {
      // d := |d|, dmin := -|dmin| turns d sc q - dmin m into |d| sc q + |dmin| m.
      std::memcpy(abs_row.data(), r.row(i), r.stride);
      const ScaleFields f = FieldsOf(r.type);
      for (size_t b = 0; b < r.stride; b += tr.block_bytes) {
        char* blk = abs_row.data() + b;
        PutF16(blk + f.d, GetF16(blk + f.d) & 0x7fff);
        PutF16(blk + f.dmin, GetF16(blk + f.dmin) | 0x8000);
      }
      DequantizeRow(r.type, abs_row.data(), tmp.data(), r.k);
      for (int64_t j = 0; j < r.k; ++j) r.magnitude[i * r.k + j] = std::fabs(tmp[j]);
    } else {
      for (int64_t j = 0; j < r.k; ++j) r.magnitude[i * r.k + j] = std::fabs(r.values[i * r.k + j]);
    }
  }
}

enum class Scales { kUnit, kRandom };

// Weight rows with uniformly random bytes (every bit pattern of codes and sub-block scales is
// valid) and super-scales either 1 or random finite f16 of either sign.
Rows RandomWeights(DType type, int rows, int64_t k, Scales scales, std::mt19937& rng) {
  Rows r = MakeEmpty(type, rows, k);
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> log_mag(-12.f, 2.f);
  std::bernoulli_distribution neg(0.25);
  for (char& c : r.bytes) c = static_cast<char>(byte(rng));
  const ScaleFields f = FieldsOf(type);
  const size_t bb = Traits(type).block_bytes;
  auto scale = [&] {
    if (scales == Scales::kUnit) return uint16_t{0x3c00};
    return F32ToF16((neg(rng) ? -1.f : 1.f) * std::exp2(log_mag(rng)));
  };
  for (int i = 0; i < rows; ++i) {
    for (size_t b = 0; b < r.stride; b += bb) {
      PutF16(r.row(i) + b + f.d, scale());
      if (f.dmin >= 0) PutF16(r.row(i) + b + f.dmin, scale());
    }
  }
  Expand(r);
  return r;
}

// Sets bsums from the codes (the Q8_K contract every kernel relies on).
void FixBsums(BlockQ8_K& b) {
  for (int i = 0; i < 16; ++i) {
    int s = 0;
    for (int l = 0; l < 16; ++l) s += b.qs[16 * i + l];
    b.bsums[i] = static_cast<int16_t>(s);
  }
}

// Activation rows of `act` (Q8_0 or Q8_K) with codes drawn from [lo, hi] and scales 1 or random.
Rows RandomActivations(DType act, int rows, int64_t k, int lo, int hi, Scales scales,
                       std::mt19937& rng) {
  Rows r = MakeEmpty(act, rows, k);
  std::uniform_int_distribution<int> code(lo, hi);
  std::uniform_real_distribution<float> log_mag(-10.f, 3.f);
  for (int i = 0; i < rows; ++i) {
    if (act == DType::kQ8_K) {
      BlockQ8_K* b = reinterpret_cast<BlockQ8_K*>(r.row(i));
      for (int64_t j = 0; j < k / kQK; ++j) {
        for (int8_t& q : b[j].qs) q = static_cast<int8_t>(code(rng));
        FixBsums(b[j]);
        b[j].d = scales == Scales::kUnit ? 1.f : std::exp2(log_mag(rng));
      }
    } else {
      BlockQ8_0* b = reinterpret_cast<BlockQ8_0*>(r.row(i));
      for (int64_t j = 0; j < k / kQ8_0BlockSize; ++j) {
        for (int8_t& q : b[j].qs) q = static_cast<int8_t>(code(rng));
        b[j].d = scales == Scales::kUnit ? uint16_t{0x3c00} : F32ToF16(std::exp2(log_mag(rng)));
      }
    }
  }
  Expand(r);
  return r;
}

// Activations as MatMul makes them: the scalar reference quantizer on random floats.
Rows QuantizedActivations(DType act, int rows, int64_t k, std::mt19937& rng) {
  Rows r = MakeEmpty(act, rows, k);
  std::normal_distribution<float> normal(0.f, 2.f);
  std::vector<float> x(k);
  for (int i = 0; i < rows; ++i) {
    for (float& v : x) v = normal(rng);
    for (int64_t j = 0; j < k; j += 97) x[j] *= 20.f;  // outliers: uneven block scales
    QuantizeRow(act, x.data(), r.row(i), k);
  }
  Expand(r);
  return r;
}

int64_t NumBlocks(DType t, int64_t k) { return k / Traits(t).block_size; }

class KQuantKernelsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    avx2_ = Avx2Kernels();
    if (avx2_ == nullptr || &SelectKernels(false) != avx2_) {
      GTEST_SKIP() << "AVX2 kernels not available on this build/CPU";
    }
  }

  // Runs every tile shape of both tables on w x a and checks every output.
  void CheckTiles(const Format& f, const Rows& w, const Rows& a, bool exact,
                  const std::string& what) {
    const int g = static_cast<int>(f.gemm);
    CheckTiles(f, w, a, exact, what, s_.gemm[g], avx2_->gemm[g], /*same_bits=*/false);
  }
  // The same for a given pair of tiles (scalar, AVX2); same_bits: they must agree bit for bit.
  void CheckTiles(const Format& f, const Rows& w, const Rows& a, bool exact,
                  const std::string& what, GemmTileFn scalar, GemmTileFn avx2, bool same_bits) {
    ASSERT_EQ(w.k, a.k);
    const int64_t k = w.k;
    const int64_t nb = NumBlocks(f.type, k);
    for (int nr = 1; nr <= std::min(kGemmTileW, w.rows); ++nr) {
      for (int nc = 1; nc <= std::min(kGemmTileX, a.rows); ++nc) {
        const int64_t ys = 6;  // y stride larger than the tile
        std::vector<float> ya(nc * ys, -999.f), yb(nc * ys, -999.f);
        scalar(k, w.bytes.data(), w.stride, nr, a.bytes.data(), a.stride, nc, ya.data(), ys);
        avx2(k, w.bytes.data(), w.stride, nr, a.bytes.data(), a.stride, nc, yb.data(), ys);
        if (same_bits) {
          ASSERT_EQ(std::memcmp(ya.data(), yb.data(), ya.size() * sizeof(float)), 0)
              << what << " k " << k << " tile " << nr << "x" << nc;
        }
        for (int c = 0; c < nc; ++c) {
          for (int r = 0; r < ys; ++r) {
            if (r >= nr) {  // outside the tile: untouched
              ASSERT_EQ(ya[c * ys + r], -999.f);
              ASSERT_EQ(yb[c * ys + r], -999.f);
              continue;
            }
            double ref = 0, t = 0;
            for (int64_t j = 0; j < k; ++j) {
              ref += w.values[r * k + j] * a.values[c * k + j];
              t += w.magnitude[r * k + j] * std::fabs(a.values[c * k + j]);
            }
            SCOPED_TRACE(::testing::Message() << Name(f.type) << " " << what << " k " << k
                                              << " tile " << nr << "x" << nc << " y[" << c
                                              << "," << r << "] ref " << ref << " T " << t);
            if (exact) {
              ASSERT_LT(t, 0x1p24);  // every partial sum is an exact float
              ASSERT_EQ(ya[c * ys + r], ref);
              ASSERT_EQ(yb[c * ys + r], ref);
            } else {
              const double tol = (nb + 16) * 0x1p-24 * t + 1e-30;
              ASSERT_NEAR(ya[c * ys + r], ref, tol);
              ASSERT_NEAR(yb[c * ys + r], ref, tol);
              ASSERT_NEAR(yb[c * ys + r], ya[c * ys + r], tol);
            }
          }
        }
      }
    }
  }

  // Block counts: 1, 2, 3 (odd, and a Q4_0 pair plus a single), 9.
  static std::vector<int64_t> Ks(const Format& f) {
    const int64_t bs = Traits(f.type).block_size;
    return {bs, 2 * bs, 3 * bs, 9 * bs};
  }

  const Kernels& s_ = ScalarKernels();
  const Kernels* avx2_ = nullptr;
  std::mt19937 rng_{77};
};

// The 512-bit tiles (k_quants_avx512.cc) compute the integers of the AVX2 tiles they stand in for
// and the same F32 steps: Q3_K must give the AVX2 tile's bits on every tile shape (the repacked
// Q2_K tiles are held to the scalar reference's bits below, through the AVX2 table).
TEST_F(KQuantKernelsTest, ZmmQ3KTilesGiveTheAvx2TilesBits) {
  const ZmmKQuantTiles zmm = ZmmKQuantTilesIfSupported();
  if (zmm.q3_k == nullptr || Q3KTileAvx2Only() == nullptr) {
    GTEST_SKIP() << "no AVX512F/BW/VL/VNNI (or PDSERVE_CPU_ISA / PDSERVE_CPU_NO_VNNI turn it off)";
  }
  const Format f{DType::kQ3_K, GemmType::kQ3_K, DType::kQ8_K};
  for (int64_t k : Ks(f)) {
    const Rows w = RandomWeights(f.type, kGemmTileW, k, Scales::kRandom, rng_);
    const Rows a = RandomActivations(f.act, kGemmTileX, k, -127, 127, Scales::kRandom, rng_);
    CheckTiles(f, w, a, /*exact=*/false, "q3_K zmm vs avx2", Q3KTileAvx2Only(), zmm.q3_k,
               /*same_bits=*/true);
  }
}

// The 512-bit Q4_K repacked-GEMV and Q6_K tiles (several decode rows per weight unpacking) and
// the Q4_K repacked-GEMM and Q6_K tiled-order tiles (prompt rows) give
// the AVX2 tiles' bits on every tile shape: random blocks over the whole range of codes, scale
// bytes and super-scales, and blocks filled with extreme codes and scale bytes against
// activations at -128 / 127 (the int16 products and int32 sums at their limits). Through the AVX2
// table, which dispatches to them, they are also held to the scalar references below.
TEST_F(KQuantKernelsTest, ZmmQ4KAndQ6KTilesGiveTheAvx2TilesBits) {
  const ZmmKQuantTiles zmm = ZmmKQuantTilesIfSupported();
  if (zmm.q4_k_repack_gemv == nullptr || zmm.q6_k == nullptr || zmm.q4_k_repack_gemm == nullptr ||
      zmm.q6_k_wide == nullptr) {
    GTEST_SKIP() << "no AVX512F/BW/VL/VNNI (or PDSERVE_CPU_NO_VNNI set)";
  }
  struct Variant {
    const char* name;
    Format f;
    GemmTileFn avx2, zmm;
    int scale_lo, scale_hi;  // sub-block scale bytes of a block
  };
  const Variant variants[] = {
      {"q4_K repacked gemv zmm vs avx2",
       {DType::kQ4_K, GemmType::kQ4_K, DType::kQ8_K},
       Q4KRepackGemvTileAvx2Only(),
       zmm.q4_k_repack_gemv,
       4,
       16},
      {"q4_K repacked gemm zmm vs avx2",
       {DType::kQ4_K, GemmType::kQ4_K, DType::kQ8_K},
       Q4KRepackGemmTileAvx2Only(),
       zmm.q4_k_repack_gemm,
       4,
       16},
      {"q6_K tiled zmm vs avx2",
       {DType::kQ6_K, GemmType::kQ6_K, DType::kQ8_K},
       Q6KWideTileAvx2Only(),
       zmm.q6_k_wide,
       192,
       208},
      {"q6_K zmm vs avx2",
       {DType::kQ6_K, GemmType::kQ6_K, DType::kQ8_K},
       Q6KTileAvx2Only(),
       zmm.q6_k,
       192,
       208},
  };
  for (const Variant& v : variants) {
    ASSERT_NE(v.avx2, nullptr) << v.name;
    for (int64_t k : Ks(v.f)) {
      const Rows w = RandomWeights(v.f.type, kGemmTileW, k, Scales::kRandom, rng_);
      const Rows a = RandomActivations(v.f.act, kGemmTileX, k, -128, 127, Scales::kRandom, rng_);
      CheckTiles(v.f, w, a, /*exact=*/false, v.name, v.avx2, v.zmm, /*same_bits=*/true);
    }
    const ScaleFields fl = FieldsOf(v.f.type);
    const size_t bb = Traits(v.f.type).block_bytes;
    for (uint8_t fill : {0x00, 0xff, 0x55, 0xaa, 0x0f, 0xf0}) {
      const int64_t k = 2 * kQK;
      Rows w = RandomWeights(v.f.type, kGemmTileW, k, Scales::kRandom, rng_);
      // Row 0: codes and scale bytes = fill; row 1: codes = fill, scale bytes complemented.
      for (int row = 0; row < 2; ++row) {
        for (size_t b = 0; b < w.stride; b += bb) {
          char* blk = w.row(row) + b;
          const uint16_t d = GetF16(blk + fl.d);
          const uint16_t dmin = fl.dmin >= 0 ? GetF16(blk + fl.dmin) : 0;
          std::memset(blk, fill, bb);
          if (row == 1) {
            for (int i = v.scale_lo; i < v.scale_hi; ++i) blk[i] = static_cast<char>(~fill);
          }
          PutF16(blk + fl.d, d);
          if (fl.dmin >= 0) PutF16(blk + fl.dmin, dmin);
        }
      }
      Expand(w);
      Rows a = RandomActivations(v.f.act, kGemmTileX, k, -128, 127, Scales::kRandom, rng_);
      for (int row = 0; row < 3; ++row) {  // all 127, alternating -128 / 127, all -128
        for (int64_t j = 0; j < k / kQK; ++j) {
          BlockQ8_K& blk = reinterpret_cast<BlockQ8_K*>(a.row(row))[j];
          for (int l = 0; l < kQK; ++l) {
            blk.qs[l] = static_cast<int8_t>(row == 0 ? 127 : row == 2 ? -128 : (l % 2 ? 127 : -128));
          }
          FixBsums(blk);
        }
      }
      Expand(a);
      CheckTiles(v.f, w, a, /*exact=*/false, std::string(v.name) + " fill " + std::to_string(fill),
                 v.avx2, v.zmm, /*same_bits=*/true);
    }
  }
}

// The five-column tiles (Kernels::q4_k_repack_gemv5, q6_k5: a K = 4 speculative step's rows in
// one pass) give, for every weight-row count, what the table's 4-column tile gives for columns
// 0-3 and its 1-column tile for column 4, bit for bit, and touch no y outside the tile: random
// blocks, blocks of extreme codes against activations at -128 / 127. Through the AVX2 table they
// are the 512-bit tiles where the CPU runs them and the 4 + 1 split elsewhere; the scalar table
// has none (the driver splits).
TEST_F(KQuantKernelsTest, FiveColumnTilesGiveTheFourAndOneColumnBits) {
  EXPECT_EQ(s_.q4_k_repack_gemv5, nullptr);
  EXPECT_EQ(s_.q6_k5, nullptr);
  struct Variant {
    const char* name;
    DType type;
    GemmTileFn five, one_to_four;
  };
  const Variant variants[] = {
      {"q4_K repacked gemv", DType::kQ4_K, avx2_->q4_k_repack_gemv5, avx2_->q4_k_repack_gemv},
      {"q6_K", DType::kQ6_K, avx2_->q6_k5, avx2_->gemm[static_cast<int>(GemmType::kQ6_K)]},
  };
  constexpr int kCols = kGemmTileX + 1;
  for (const Variant& v : variants) {
    ASSERT_NE(v.five, nullptr) << v.name;
    for (int64_t k : {kQK, 3 * kQK, 10 * kQK}) {
      for (int extreme = 0; extreme < 2; ++extreme) {
        Rows w = RandomWeights(v.type, kGemmTileW, k, Scales::kRandom, rng_);
        Rows a = RandomActivations(DType::kQ8_K, kCols, k, -128, 127, Scales::kRandom, rng_);
        if (extreme) {
          const size_t bb = Traits(v.type).block_bytes;
          const ScaleFields fl = FieldsOf(v.type);
          for (int row = 0; row < kGemmTileW; ++row) {
            for (size_t b = 0; b < w.stride; b += bb) {
              char* blk = w.row(row) + b;
              const uint16_t d = GetF16(blk + fl.d);
              const uint16_t dmin = fl.dmin >= 0 ? GetF16(blk + fl.dmin) : 0;
              std::memset(blk, row % 2 ? 0xff : 0xaa, bb);
              PutF16(blk + fl.d, d);
              if (fl.dmin >= 0) PutF16(blk + fl.dmin, dmin);
            }
          }
          for (int row = 0; row < kCols; ++row) {
            for (int64_t j = 0; j < k / kQK; ++j) {
              BlockQ8_K& blk = reinterpret_cast<BlockQ8_K*>(a.row(row))[j];
              for (int l = 0; l < kQK; ++l) {
                blk.qs[l] = static_cast<int8_t>(row % 2 ? 127 : (l % 3 ? -128 : 127));
              }
              FixBsums(blk);
            }
          }
        }
        for (int nr = 1; nr <= kGemmTileW; ++nr) {
          const int64_t ys = 6;  // y stride larger than the tile
          std::vector<float> y5(kCols * ys, -999.f), y41(kCols * ys, -999.f);
          v.five(k, w.bytes.data(), w.stride, nr, a.bytes.data(), a.stride, kCols, y5.data(), ys);
          v.one_to_four(k, w.bytes.data(), w.stride, nr, a.bytes.data(), a.stride, kGemmTileX,
                        y41.data(), ys);
          v.one_to_four(k, w.bytes.data(), w.stride, nr, a.row(kGemmTileX), a.stride, 1,
                        y41.data() + kGemmTileX * ys, ys);
          for (size_t i = 0; i < y5.size(); ++i) {
            ASSERT_EQ(BitsFromFp32(y5[i]), BitsFromFp32(y41[i]))
                << v.name << " k " << k << " extreme " << extreme << " rows " << nr << " y["
                << i / ys << "," << i % ys << "]";
          }
          for (int c = 0; c < kCols; ++c) {
            for (int r = nr; r < ys; ++r) ASSERT_EQ(y5[c * ys + r], -999.f);
          }
        }
      }
    }
  }
}

// An AVX2 grouped k-quant kernel (prompt rows eight per register) against the AVX2 tile of the
// order it reproduces, bit for bit: random blocks over every code and scale, and extreme ones
// (every code at its maximum and the sub-block scales at their extremes, against activations all
// -128 or all 127: the int16 sums at their bound), one super-block and several, weight chunks of
// one row to more than one 64-row panel, prompt rows filling one group of 8, two, and tails.
void ExpectGroupedKQuantGivesTileBits(DType type, const GroupedKernels* g, GemmTileFn tile,
                                      std::mt19937& rng) {
  ASSERT_NE(g, nullptr);
  ASSERT_NE(tile, nullptr);
  for (int64_t k : {kQK, 2 * kQK, 8 * kQK}) {
    for (int rows : {1, 3, 8, 70}) {
      for (int n : {1, 7, 8, 12, 16, 17, 24, 40}) {
        for (bool extreme : {false, true}) {
          Rows w = RandomWeights(type, rows, k, Scales::kRandom, rng);
          Rows a = RandomActivations(DType::kQ8_K, n, k, -128, 127, Scales::kRandom, rng);
          if (extreme) {
            for (int r = 0; r < rows; ++r) {
              for (int64_t j = 0; j < k / kQK; ++j) {
                if (type == DType::kQ4_K) {
                  BlockQ4_K& b = reinterpret_cast<BlockQ4_K*>(w.row(r))[j];
                  std::memset(b.scales, 0xff, sizeof(b.scales));  // scales and mins 63
                  std::memset(b.qs, 0xff, sizeof(b.qs));
                } else {
                  BlockQ6_K& b = reinterpret_cast<BlockQ6_K*>(w.row(r))[j];
                  std::memset(b.ql, 0xff, sizeof(b.ql));
                  std::memset(b.qh, 0xff, sizeof(b.qh));
                  std::memset(b.scales, r % 2 ? 0x80 : 0x7f, sizeof(b.scales));
                }
              }
            }
            for (int c = 0; c < n; ++c) {
              auto* b = reinterpret_cast<BlockQ8_K*>(a.row(c));
              for (int64_t j = 0; j < k / kQK; ++j) {
                std::memset(b[j].qs, c % 2 ? 0x7f : 0x80, sizeof(b[j].qs));
                FixBsums(b[j]);
              }
            }
          }
          std::vector<float> want(static_cast<size_t>(n) * rows), got(want.size(), -1.f);
          for (int c = 0; c < n; c += kGemmTileX) {
            for (int r = 0; r < rows; r += kGemmTileW) {
              tile(k, w.row(r), w.stride, std::min(kGemmTileW, rows - r), a.row(c), a.stride,
                   std::min(kGemmTileX, n - c), want.data() + c * rows + r, rows);
            }
          }
          std::vector<char> xp(g->x_bytes(n, k) + 64), wp(g->w_bytes(rows, k));
          char* xa = xp.data() + (64 - reinterpret_cast<uintptr_t>(xp.data()) % 64) % 64;
          g->pack_x(a.row(0), a.stride, n, k, xa);
          g->pack_w(w.row(0), w.stride, rows, k, wp.data());
          g->gemm(k, wp.data(), 0, rows, xa, n, got.data(), rows);
          for (size_t i = 0; i < want.size(); ++i) {
            ASSERT_EQ(std::bit_cast<uint32_t>(want[i]), std::bit_cast<uint32_t>(got[i]))
                << Name(type) << " k " << k << " rows " << rows << " n " << n
                << (extreme ? " extreme" : "") << " at row " << i % rows << ", prompt row "
                << i / rows << ": " << want[i] << " vs " << got[i];
          }
        }
      }
    }
  }
}

TEST_F(KQuantKernelsTest, GroupedAvx2Q4KGivesTheRepackedGemmTileBits) {
  ExpectGroupedKQuantGivesTileBits(DType::kQ4_K, Q4KRepackGroupedAvx2(),
                                   Q4KRepackGemmTileAvx2Only(), rng_);
}

TEST_F(KQuantKernelsTest, GroupedAvx2Q6KGivesTheTiledOrderTileBits) {
  ExpectGroupedKQuantGivesTileBits(DType::kQ6_K, Q6KWideGroupedAvx2(), Q6KWideTileAvx2Only(), rng_);
}

// llama.cpp's other x86 orders (kernels.h: q4_k_repack_*, q2_k_repack_*, gemm_wide): the
// AVX2 tiles must give the scalar reference's bits, on every tile shape and on random blocks
// (codes, sub-block scales and super-scales over their whole ranges), and stay within the
// reordering bound of the exact product.
TEST_F(KQuantKernelsTest, LlamaCppOrdersMatchTheScalarTablesBitForBit) {
  struct Variant {
    const char* name;
    Format f;
    GemmTileFn scalar, avx2;
  };
  const Variant variants[] = {
      {"q4_K repacked gemm", {DType::kQ4_K, GemmType::kQ4_K, DType::kQ8_K},
       s_.q4_k_repack_gemm, avx2_->q4_k_repack_gemm},
      {"q4_K repacked gemv", {DType::kQ4_K, GemmType::kQ4_K, DType::kQ8_K},
       s_.q4_k_repack_gemv, avx2_->q4_k_repack_gemv},
      {"q2_K repacked gemm", {DType::kQ2_K, GemmType::kQ2_K, DType::kQ8_K},
       s_.q2_k_repack_gemm, avx2_->q2_k_repack_gemm},
      {"q2_K repacked gemv", {DType::kQ2_K, GemmType::kQ2_K, DType::kQ8_K},
       s_.q2_k_repack_gemv, avx2_->q2_k_repack_gemv},
      {"q4_K tiled", {DType::kQ4_K, GemmType::kQ4_K, DType::kQ8_K},
       s_.gemm_wide[static_cast<int>(GemmType::kQ4_K)],
       avx2_->gemm_wide[static_cast<int>(GemmType::kQ4_K)]},
      {"q5_K tiled", {DType::kQ5_K, GemmType::kQ5_K, DType::kQ8_K},
       s_.gemm_wide[static_cast<int>(GemmType::kQ5_K)],
       avx2_->gemm_wide[static_cast<int>(GemmType::kQ5_K)]},
      {"q6_K tiled", {DType::kQ6_K, GemmType::kQ6_K, DType::kQ8_K},
       s_.gemm_wide[static_cast<int>(GemmType::kQ6_K)],
       avx2_->gemm_wide[static_cast<int>(GemmType::kQ6_K)]},      // ggml's vec_dot order (fewer than 8 rows, matrices llama.cpp does not repack).
      {"q4_K vec_dot", {DType::kQ4_K, GemmType::kQ4_K, DType::kQ8_K},
       s_.gemm[static_cast<int>(GemmType::kQ4_K)], avx2_->gemm[static_cast<int>(GemmType::kQ4_K)]},
      {"q5_K vec_dot", {DType::kQ5_K, GemmType::kQ5_K, DType::kQ8_K},
       s_.gemm[static_cast<int>(GemmType::kQ5_K)], avx2_->gemm[static_cast<int>(GemmType::kQ5_K)]},
  };
  for (const Variant& v : variants) {
    ASSERT_NE(v.scalar, nullptr) << v.name;
    ASSERT_NE(v.avx2, nullptr) << v.name;
    for (int64_t k : Ks(v.f)) {
      const Rows w = RandomWeights(v.f.type, kGemmTileW, k, Scales::kRandom, rng_);
      const Rows a = RandomActivations(v.f.act, kGemmTileX, k, -127, 127, Scales::kRandom, rng_);
      CheckTiles(v.f, w, a, /*exact=*/false, v.name, v.scalar, v.avx2, /*same_bits=*/true);
    }
  }
}

TEST_F(KQuantKernelsTest, UnitScalesAreExact) {
  // Random codes and sub-block scales over their whole ranges; activations limited to [-12, 12]
  // so that T < 2^24 and every F32 step is exact.
  for (const Format& f : kFormats) {
    for (int64_t k : Ks(f)) {
      for (int rep = 0; rep < 3; ++rep) {
        const Rows w = RandomWeights(f.type, kGemmTileW, k, Scales::kUnit, rng_);
        const Rows a = RandomActivations(f.act, kGemmTileX, k, -12, 12, Scales::kUnit, rng_);
        CheckTiles(f, w, a, /*exact=*/true, "unit scales");
      }
    }
  }
}

TEST_F(KQuantKernelsTest, RandomBlocksMatchReference) {
  for (const Format& f : kFormats) {
    for (int64_t k : Ks(f)) {
      for (int rep = 0; rep < 3; ++rep) {
        const Rows w = RandomWeights(f.type, kGemmTileW, k, Scales::kRandom, rng_);
        const Rows raw = RandomActivations(f.act, kGemmTileX, k, -128, 127, Scales::kRandom, rng_);
        CheckTiles(f, w, raw, false, "raw activations");
        const Rows q = QuantizedActivations(f.act, kGemmTileX, k, rng_);
        CheckTiles(f, w, q, false, "quantized activations");
      }
    }
  }
}

TEST_F(KQuantKernelsTest, ExtremeBlocks) {
  // Every code at its maximum or minimum, every scale byte at its extremes, activations at
  // 127 / -128 / alternating: the int16 and int32 intermediate ranges at their limits.
  const std::vector<uint8_t> fills = {0x00, 0xff, 0x55, 0xaa, 0x0f, 0xf0};
  for (const Format& f : kFormats) {
    for (int64_t k : {Traits(f.type).block_size, 3 * Traits(f.type).block_size}) {
      for (uint8_t fill : fills) {
        for (Scales sc : {Scales::kUnit, Scales::kRandom}) {
          Rows w = RandomWeights(f.type, kGemmTileW, k, sc, rng_);
          // Row 0: all bytes but the super-scales = fill; row 1: codes = fill, scale bytes
          // complemented; rows 2-3 random.
          const ScaleFields fl = FieldsOf(f.type);
          const size_t bb = Traits(f.type).block_bytes;
          for (int row = 0; row < 2; ++row) {
            for (size_t b = 0; b < w.stride; b += bb) {
              char* blk = w.row(row) + b;
              const uint16_t d = GetF16(blk + fl.d);
              const uint16_t dmin = fl.dmin >= 0 ? GetF16(blk + fl.dmin) : 0;
              std::memset(blk, fill, bb);
              if (row == 1) {
                // Sub-block scale bytes: Q2_K bytes 0-15, Q3_K 96-107, Q4_K/Q5_K 4-15, Q6_K
                // 192-207; Q4_0 has none.
                int lo = 0, hi = 0;
                switch (f.type) {
                  case DType::kQ2_K: lo = 0, hi = 16; break;
                  case DType::kQ3_K: lo = 96, hi = 108; break;
                  case DType::kQ4_K:
                  case DType::kQ5_K: lo = 4, hi = 16; break;
                  case DType::kQ6_K: lo = 192, hi = 208; break;
                  default: break;
                }
                for (int i = lo; i < hi; ++i) blk[i] = static_cast<char>(~fill);
              }
              PutF16(blk + fl.d, d);
              if (fl.dmin >= 0) PutF16(blk + fl.dmin, dmin);
            }
          }
          Expand(w);
          for (int mode = 0; mode < 3; ++mode) {
            Rows a = RandomActivations(f.act, kGemmTileX, k, -128, 127, sc, rng_);
            for (int row = 0; row < 3; ++row) {  // rows 0-2 extreme, row 3 random
              const int64_t nblk = NumBlocks(f.act, k);
              for (int64_t j = 0; j < nblk; ++j) {
                int8_t* qs = f.act == DType::kQ8_K
                                 ? reinterpret_cast<BlockQ8_K*>(a.row(row))[j].qs
                                 : reinterpret_cast<BlockQ8_0*>(a.row(row))[j].qs;
                const int n = f.act == DType::kQ8_K ? kQK : kQ8_0BlockSize;
                for (int l = 0; l < n; ++l) {
                  const int v = row == 0 ? (mode == 0 ? 127 : -128)
                                : row == 1 ? (l % 2 ? 127 : -128)
                                           : (mode == 2 ? -128 : 127);
                  qs[l] = static_cast<int8_t>(v);
                }
                if (f.act == DType::kQ8_K) FixBsums(reinterpret_cast<BlockQ8_K*>(a.row(row))[j]);
              }
            }
            Expand(a);
            CheckTiles(f, w, a, false,
                       "extreme fill " + std::to_string(fill) + " mode " + std::to_string(mode));
          }
        }
      }
    }
  }
}

TEST_F(KQuantKernelsTest, ExtremeSuperScales) {
  // f16 super-scales at the largest finite value, the smallest subnormal and normal, and -0.
  const uint16_t kScales[] = {0x7bff, 0xfbff, 0x0001, 0x0400, 0x8000};
  for (const Format& f : kFormats) {
    const int64_t k = 3 * Traits(f.type).block_size;
    const ScaleFields fl = FieldsOf(f.type);
    const size_t bb = Traits(f.type).block_bytes;
    for (uint16_t d : kScales) {
      Rows w = RandomWeights(f.type, kGemmTileW, k, Scales::kRandom, rng_);
      for (int row = 0; row < w.rows; ++row) {
        for (size_t b = 0; b < w.stride; b += bb) {
          PutF16(w.row(row) + b + fl.d, d);
          if (fl.dmin >= 0 && row % 2 == 0) PutF16(w.row(row) + b + fl.dmin, d);
        }
      }
      Expand(w);
      const Rows a = RandomActivations(f.act, kGemmTileX, k, -128, 127, Scales::kRandom, rng_);
      CheckTiles(f, w, a, false, "super-scale " + std::to_string(d));
    }
  }
}

TEST_F(KQuantKernelsTest, ZeroActivationBlocks) {
  // An all-zero input row quantizes to d = 0 blocks; the dot must be exactly 0.
  for (const Format& f : kFormats) {
    const int64_t k = 2 * Traits(f.type).block_size;
    const Rows w = RandomWeights(f.type, 4, k, Scales::kRandom, rng_);
    std::vector<float> zeros(k, 0.f);
    Rows a = MakeEmpty(f.act, 1, k);
    QuantizeRow(f.act, zeros.data(), a.row(0), k);
    float ys[4], ya[4];
    const int g = static_cast<int>(f.gemm);
    s_.gemm[g](k, w.bytes.data(), w.stride, 4, a.bytes.data(), a.stride, 1, ys, 4);
    avx2_->gemm[g](k, w.bytes.data(), w.stride, 4, a.bytes.data(), a.stride, 1, ya, 4);
    for (int r = 0; r < 4; ++r) {
      EXPECT_EQ(ys[r], 0.f) << Name(f.type);
      EXPECT_EQ(ya[r], 0.f) << Name(f.type);
    }
  }
}

TEST_F(KQuantKernelsTest, Q8KQuantizeBitExact) {
  const int kBlocks = 2000;
  std::vector<float> x;
  std::uniform_real_distribution<float> log_scale(-30.f, 30.f);
  std::normal_distribution<float> normal;
  for (int b = 0; b < kBlocks; ++b) {
    const float scale = std::exp2(log_scale(rng_));
    std::vector<float> v(kQK);
    for (float& f : v) f = normal(rng_) * scale;
    if (b % 3 == 0) {
      // Ties: max -127 makes iscale exactly 1, so k + 0.5 lands halfway (rounds to even).
      v[7] = -127.f;
      for (int j = 0; j < kQK; ++j) {
        if (j != 7) v[j] = std::clamp(std::round(v[j]) + (j % 2 ? 0.5f : -0.5f), -126.5f, 126.5f);
      }
    }
    if (b % 5 == 0) {  // largest magnitude twice with opposite signs: the first one wins
      v[200] = 1e3f * scale;
      v[31] = -1e3f * scale;
    }
    if (b % 7 == 0) std::fill(v.begin(), v.end(), 0.f);
    if (b % 11 == 0) v[5] = -0.f;
    if (b % 13 == 0) std::fill(v.begin(), v.end(), -3.f);
    x.insert(x.end(), v.begin(), v.end());
  }
  std::vector<BlockQ8_K> qs(kBlocks), qa(kBlocks);
  s_.quantize_q8_k(x.data(), qs.data(), x.size());
  avx2_->quantize_q8_k(x.data(), qa.data(), x.size());
  for (int b = 0; b < kBlocks; ++b) {
    ASSERT_EQ(BitsFromFp32(qs[b].d), BitsFromFp32(qa[b].d)) << b;
    for (int j = 0; j < kQK; ++j) ASSERT_EQ(qs[b].qs[j], qa[b].qs[j]) << b << "," << j;
    for (int i = 0; i < 16; ++i) ASSERT_EQ(qs[b].bsums[i], qa[b].bsums[i]) << b << "," << i;
  }
  // The scalar table is the k_quants.h reference itself; tie blocks round to even.
  std::vector<BlockQ8_K> ref(kBlocks);
  QuantizeRow(x.data(), ref.data(), x.size());
  ASSERT_EQ(std::memcmp(ref.data(), qs.data(), ref.size() * sizeof(BlockQ8_K)), 0);
  EXPECT_EQ(qs[3].d, 1.f);  // max -127: iscale = 1
  EXPECT_EQ(qs[5].qs[31], -127);  // the first of +-1e3 sets the sign of the scale
  EXPECT_EQ(qs[5].qs[200], 127);
}

// ---- MatMul through the backend --------------------------------------------------------------

struct Config {
  bool force_scalar;
  int threads;
};

class KQuantMatMulTest : public ::testing::TestWithParam<Config> {
 protected:
  std::unique_ptr<Backend> be_ =
      CreateCpuBackend({.threads = GetParam().threads, .force_scalar = GetParam().force_scalar});
  std::mt19937 rng_{2024};
};

INSTANTIATE_TEST_SUITE_P(Kernels, KQuantMatMulTest,
                         ::testing::Values(Config{false, 3}, Config{true, 2}, Config{false, 1}),
                         [](const auto& info) {
                           return std::string(info.param.force_scalar ? "Scalar" : "Best") +
                                  std::to_string(info.param.threads) + "Threads";
                         });

// y = x w^T through MatMul vs double products of DequantizeRow(w) and the dequantized reference
// quantization of x.
void CheckMatMul(Backend& be, std::mt19937& rng, const Format& f, int64_t n, int64_t m,
                 int64_t k) {
  SCOPED_TRACE(::testing::Message() << Name(f.type) << " n " << n << " m " << m << " k " << k);
  std::normal_distribution<float> normal;
  std::vector<float> xf(n * k);
  for (float& v : xf) v = 3.f * normal(rng);
  // Random blocks (fast to make; quantized weights are used in CloseToUnquantizedProduct).
  Rows w = RandomWeights(f.type, static_cast<int>(m), k, Scales::kRandom, rng);
  Rows xq = MakeEmpty(f.act, static_cast<int>(n), k);
  for (int64_t r = 0; r < n; ++r) QuantizeRow(f.act, xf.data() + r * k, xq.row(r), k);
  Expand(xq);

  Tensor wt{f.type, k, m, w.bytes.data()};
  Tensor xt{DType::kF32, k, n, xf.data()};
  std::vector<float> yv(n * m, NAN);
  Tensor yt{DType::kF32, m, n, yv.data()};
  ASSERT_THAT(be.MatMul(wt, xt, yt), IsOk());
  const int64_t nb = NumBlocks(f.type, k);
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < m; ++j) {
      double ref = 0, t = 0;
      for (int64_t l = 0; l < k; ++l) {
        ref += w.values[j * k + l] * xq.values[i * k + l];
        t += w.magnitude[j * k + l] * std::fabs(xq.values[i * k + l]);
      }
      ASSERT_NEAR(yv[i * m + j], ref, (nb + 16) * 0x1p-24 * t + 1e-30)
          << "y[" << i << ", " << j << "]";
    }
  }
}

TEST_P(KQuantMatMulTest, AllFormatsAndShapes) {
  for (const Format& f : kFormats) {
    const int64_t bs = Traits(f.type).block_size;
    // Decode (n = 1) and prefill batches, m not a multiple of the 4-row tile, odd block counts.
    const std::vector<std::vector<int64_t>> cases = {
        {1, 1, bs},  {1, 37, 2 * bs}, {3, 5, 3 * bs},   {5, 9, bs},
        {4, 8, 5 * bs}, {17, 33, 256}, {1, 300, 4096}, {9, 130, 9 * bs}};
    for (const auto& c : cases) CheckMatMul(*be_, rng_, f, c[0], c[1], c[2]);
  }
}

TEST_P(KQuantMatMulTest, CloseToUnquantizedProduct) {
  // Guards against a reference that shares a bug with the kernels: the result must stay near the
  // F32 product of the original values. The relative RMS error over all outputs is about the
  // relative RMS quantization error of the weights (measured: Q2_K 0.24, Q3_K 0.14, Q4_0 0.074,
  // Q4_K 0.063, Q5_K 0.029, Q6_K 0.015 on normal data); wrong codes or scales give ~1.4.
  const int64_t n = 4, m = 64, k = 1024;
  std::normal_distribution<float> normal;
  std::vector<float> wf(m * k), xf(n * k);
  for (float& v : wf) v = normal(rng_);
  for (float& v : xf) v = normal(rng_);
  std::vector<double> ref(n * m, 0.0);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < m; ++j)
      for (int64_t l = 0; l < k; ++l) ref[i * m + j] += double{wf[j * k + l]} * xf[i * k + l];
  for (const Format& f : kFormats) {
    std::vector<char> wb(RowBytes(f.type, k) * m);
    for (int64_t r = 0; r < m; ++r) {
      QuantizeRow(f.type, wf.data() + r * k, wb.data() + r * RowBytes(f.type, k), k);
    }
    Tensor wt{f.type, k, m, wb.data()}, xt{DType::kF32, k, n, xf.data()};
    std::vector<float> yv(n * m);
    Tensor yt{DType::kF32, m, n, yv.data()};
    ASSERT_THAT(be_->MatMul(wt, xt, yt), IsOk());
    double err2 = 0, ref2 = 0;
    for (int64_t i = 0; i < n * m; ++i) {
      err2 += (yv[i] - ref[i]) * (yv[i] - ref[i]);
      ref2 += ref[i] * ref[i];
    }
    const double rel = std::sqrt(err2 / ref2);
    const double bound = f.type == DType::kQ2_K   ? 0.45
                         : f.type == DType::kQ3_K ? 0.25
                         : f.type == DType::kQ4_0 ? 0.15
                         : f.type == DType::kQ5_0 ? 0.08
                         : f.type == DType::kQ4_K ? 0.12
                         : f.type == DType::kQ5_K ? 0.06
                                                  : 0.035;
    EXPECT_LT(rel, bound) << Name(f.type);
    std::printf("%s: relative RMS error vs F32 product %.4f\n", Name(f.type).c_str(), rel);
  }
}

TEST(KQuantMatMulThreadsTest, BitIdenticalAcrossThreadCounts) {
  std::mt19937 rng(5);
  std::normal_distribution<float> normal;
  const int64_t n = 6, m = 1001, k = 1024;
  std::vector<float> xf(n * k);
  for (float& v : xf) v = normal(rng);
  for (const Format& f : kFormats) {
    Rows w = RandomWeights(f.type, static_cast<int>(m), k, Scales::kRandom, rng);
    Tensor wt{f.type, k, m, w.bytes.data()}, xt{DType::kF32, k, n, xf.data()};
    std::vector<float> y1(n * m), y4(n * m);
    Tensor t1{DType::kF32, m, n, y1.data()}, t4{DType::kF32, m, n, y4.data()};
    ASSERT_THAT(CreateCpuBackend({.threads = 1})->MatMul(wt, xt, t1), IsOk());
    ASSERT_THAT(CreateCpuBackend({.threads = 4})->MatMul(wt, xt, t4), IsOk());
    EXPECT_EQ(std::memcmp(y1.data(), y4.data(), y1.size() * sizeof(float)), 0) << Name(f.type);
  }
}

// Q4_K and Q6_K prompts through the backend: on CPUs without the 512-bit tiles the leading rows
// in the order a grouped AVX2 kernel reproduces (Q4_K: the repacked GEMM order; Q6_K: the tiled
// order) take it and the others the tiles, in the same chunks. Every row must come out as the
// AVX2 tile of its order computes it: prompt lengths that leave 1-3 GEMV rows of Q4_K, explicit
// orders with one row of the other order inside the prompt (the rows after it go to the tiles),
// and chunks split over two threads.
TEST(KQuantMatMulOrdersTest, PromptRowsGiveTheirOrdersTileBits) {
  if (Avx2Kernels() == nullptr || &SelectKernels(false) != Avx2Kernels()) {
    GTEST_SKIP() << "AVX2 kernels not available on this build/CPU";
  }
  std::mt19937 rng(9);
  std::normal_distribution<float> normal;
  const int64_t m = 136, k = 512;
  std::unique_ptr<Backend> be = CreateCpuBackend({.threads = 2});
  for (DType type : {DType::kQ4_K, DType::kQ6_K}) {
    const bool q4 = type == DType::kQ4_K;
    Rows w = RandomWeights(type, static_cast<int>(m), k, Scales::kRandom, rng);
    Tensor wt{type, k, m, w.bytes.data()};
    for (int64_t n : {12, 13, 15, 16, 19, 40}) {
      for (bool explicit_orders : {false, true}) {
        std::vector<float> xf(n * k);
        for (float& v : xf) v = normal(rng);
        // The orders MatMul picks by itself (Q4_K: GEMV for the last n % 4 rows; Q6_K: tiled
        // from 8 rows), or the usual order with one row of the other inside.
        std::vector<uint8_t> orders(n, q4 ? 0 : kRowOrderWide);
        if (explicit_orders) {
          orders[n / 2] = q4 ? kRowOrderGemv : 0;
        } else if (q4) {
          for (int64_t c = n - n % 4; c < n; ++c) orders[c] = kRowOrderGemv;
        }
        Tensor xt{DType::kF32, k, n, xf.data()};
        std::vector<float> got(n * m);
        Tensor tg{DType::kF32, m, n, got.data()};
        if (explicit_orders) {
          ASSERT_THAT(be->MatMulRowOrder(wt, xt, tg, orders), IsOk());
        } else {
          ASSERT_THAT(be->MatMul(wt, xt, tg), IsOk());
        }
        for (int64_t c = 0; c < n; ++c) {
          std::vector<BlockQ8_K> xq(k / kQK);
          QuantizeRow(DType::kQ8_K, xf.data() + c * k, xq.data(), k);
          const bool other = q4 ? (orders[c] & kRowOrderGemv) : !(orders[c] & kRowOrderWide);
          const GemmTileFn tile =
              q4 ? (other ? Q4KRepackGemvTileAvx2Only() : Q4KRepackGemmTileAvx2Only())
                 : (other ? Q6KTileAvx2Only() : Q6KWideTileAvx2Only());
          std::vector<float> want(m);
          for (int64_t r = 0; r < m; r += kGemmTileW) {
            tile(k, w.row(static_cast<int>(r)), w.stride,
                 static_cast<int>(std::min<int64_t>(kGemmTileW, m - r)), xq.data(),
                 xq.size() * sizeof(BlockQ8_K), 1, want.data() + r, m);
          }
          for (int64_t r = 0; r < m; ++r) {
            ASSERT_EQ(std::bit_cast<uint32_t>(want[r]), std::bit_cast<uint32_t>(got[c * m + r]))
                << Name(type) << " n " << n << (explicit_orders ? " (explicit orders)" : "")
                << " at prompt row " << c << ", weight row " << r << ": " << want[r] << " vs "
                << got[c * m + r];
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace pd::engine::cpu
