// The CPU backend's ops against naive double-precision references written here, on both kernel
// tables (AVX2 and force_scalar), plus shape/type validation and the thread pool.
//
// Tolerances (see also cpu_kernels_test.cc):
//  - MatMul: the reference converts activations exactly as the documented method does (F16/BF16
//    rounding, Q8_0 activations via the scalar QuantizeRowQ8_0Act (ggml-cpu x86's activation
//    quantizer; Q8_0 weights via QuantizeRowQ8_0, tested in q8_0_test)) and sums in
//    double; |err| <= 8 * sqrt(k) * 2^-24 * sum|w_i x_i| (F32 summation in another order).
//  - RmsNorm / Softmax / SwiGlu / Add: 1e-6 relative (a few ulps; exp within 2 ulps).
//  - Rope: 2e-6 + |theta| * 1e-6 per element (times |x|): angles are built in F32 by repeated
//    multiplication like ggml, so their error grows with the position.
//  - Attention: 2e-5 absolute on O(1) outputs (F32 dots of head_dim terms, F32 softmax), against
//    a reference over the values the cache holds (dequantized for INT8); AVX2 vs scalar on INT8
//    KV: 1e-5.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "common/status_matchers.h"
#include "engine/backend/backend.h"
#include "engine/backend/top_k.h"
#include "engine/backend/cpu/cpu_backend_internal.h"
#include "engine/backend/cpu/kernels.h"
#include "engine/backend/cpu/thread_pool.h"
#include "engine/backend/kv_rotation.h"
#include "engine/quant/fp16.h"
#include "engine/quant/k_quants.h"
#include "engine/quant/q8_0.h"
#include "tests/engine/backend/hadamard_reference.h"

namespace pd::engine {
namespace {

using ::pd::testing::IsOk;
using ::pd::testing::StatusIs;

// Host storage for a tensor (the CPU backend computes on host memory directly).
struct HostTensor {
  std::vector<char> bytes;
  Tensor t;
  HostTensor(DType type, int64_t rows, int64_t cols) {
    t.type = type;
    t.rows = rows;
    t.cols = cols;
    bytes.resize(t.bytes() + 64);
    t.data = bytes.data();
  }
  float* f() { return static_cast<float*>(t.data); }
};

HostTensor F32(int64_t rows, int64_t cols, const std::vector<float>& v) {
  HostTensor h(DType::kF32, rows, cols);
  std::memcpy(h.t.data, v.data(), v.size() * sizeof(float));
  return h;
}

std::vector<float> RandomVec(std::mt19937& rng, int64_t n, float scale = 1.f) {
  std::normal_distribution<float> d(0.f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// Weight tensor of `type` from F32 values, and the exact values it holds. `activation`: Q8_0 rows
// as the backend quantizes matmul activations (QuantizeRowQ8_0Act: id = 127 / amax, ties to
// even, as ggml-cpu's x86 quantize_row_q8_0), not as weights are quantized.
HostTensor MakeWeights(DType type, int64_t rows, int64_t cols, const std::vector<float>& v,
                       std::vector<double>* exact, bool activation = false) {
  HostTensor h(type, rows, cols);
  exact->resize(rows * cols);
  std::vector<float> tmp(cols);
  for (int64_t r = 0; r < rows; ++r) {
    const float* src = v.data() + r * cols;
    char* dst = static_cast<char*>(h.t.data) + r * h.t.row_bytes();
    switch (type) {
      case DType::kF32:
        std::memcpy(dst, src, cols * 4);
        std::copy(src, src + cols, tmp.begin());
        break;
      case DType::kF16:
        F32ToF16Row(src, reinterpret_cast<uint16_t*>(dst), cols);
        F16ToF32Row(reinterpret_cast<uint16_t*>(dst), tmp.data(), cols);
        break;
      case DType::kBF16:
        F32ToBf16Row(src, reinterpret_cast<uint16_t*>(dst), cols);
        Bf16ToF32Row(reinterpret_cast<uint16_t*>(dst), tmp.data(), cols);
        break;
      case DType::kQ8_0:
        if (activation) {
          QuantizeRowQ8_0Act(src, reinterpret_cast<BlockQ8_0*>(dst), cols);
        } else {
          QuantizeRowQ8_0(src, reinterpret_cast<BlockQ8_0*>(dst), cols);
        }
        DequantizeRowQ8_0(reinterpret_cast<BlockQ8_0*>(dst), tmp.data(), cols);
        break;
      case DType::kQ4_0:
      case DType::kQ5_0:
      case DType::kQ2_K:
      case DType::kQ3_K:
      case DType::kQ4_K:
      case DType::kQ5_K:
      case DType::kQ6_K:
      case DType::kQ8_K:
      case DType::kW8A8:
      case DType::kW4A16:
        // The scalar reference conversions by DType (k_quants.h); their MatMul is tested in
        // k_quant_kernels_test.cc (w8a8 / w4a16: pd_format_kernels_test.cc).
        QuantizeRow(type, src, dst, cols);
        DequantizeRow(type, dst, tmp.data(), cols);
        break;
      case DType::kQ8_0x16:
      case DType::kQ5_0x16:
      case DType::kQ4_Kx16:
      case DType::kQ6_Kx16:
        ADD_FAILURE() << "the x16 layouts are made from quantized rows, not from floats";
        break;
    }
    for (int64_t c = 0; c < cols; ++c) (*exact)[r * cols + c] = tmp[c];
  }
  return h;
}

struct Config {
  bool force_scalar;
  int threads;
};
void PrintTo(const Config& c, std::ostream* os) {
  *os << (c.force_scalar ? "scalar" : "best") << " kernels, " << c.threads << " threads";
}

class CpuBackendTest : public ::testing::TestWithParam<Config> {
 protected:
  std::unique_ptr<Backend> be_ =
      CreateCpuBackend({.threads = GetParam().threads, .force_scalar = GetParam().force_scalar});
  std::mt19937 rng_{42};
};

INSTANTIATE_TEST_SUITE_P(Kernels, CpuBackendTest,
                         ::testing::Values(Config{false, 3}, Config{true, 2}, Config{false, 1}),
                         [](const auto& info) {
                           return std::string(info.param.force_scalar ? "Scalar" : "Best") +
                                  std::to_string(info.param.threads) + "Threads";
                         });

// ---- MatMul --------------------------------------------------------------------------------

struct MatMulCase {
  DType type;
  int64_t n, m, k;
};

void CheckMatMul(Backend& be, std::mt19937& rng, const MatMulCase& c) {
  SCOPED_TRACE(::testing::Message() << "type " << static_cast<int>(c.type) << " n " << c.n << " m "
                                    << c.m << " k " << c.k);
  std::vector<double> w_exact;
  std::vector<float> wv = RandomVec(rng, c.m * c.k);
  for (size_t i = 0; i < wv.size(); i += 29) wv[i] *= 10.f;  // uneven block scales
  HostTensor w = MakeWeights(c.type, c.m, c.k, wv, &w_exact);
  const std::vector<float> xv = RandomVec(rng, c.n * c.k, 3.f);
  HostTensor x = F32(c.n, c.k, xv);
  HostTensor y(DType::kF32, c.n, c.m);
  std::fill(y.f(), y.f() + c.n * c.m, NAN);
  ASSERT_THAT(be.MatMul(w.t, x.t, y.t), IsOk());

  // Activations as the method converts them: to the weight's companion type.
  std::vector<double> x_conv;
  if (c.type == DType::kF32) {
    x_conv.assign(xv.begin(), xv.end());
  } else {
    MakeWeights(c.type, c.n, c.k, xv, &x_conv, /*activation=*/true);
  }
  for (int64_t i = 0; i < c.n; ++i) {
    for (int64_t j = 0; j < c.m; ++j) {
      double ref = 0, abs_sum = 0;
      for (int64_t l = 0; l < c.k; ++l) {
        const double p = w_exact[j * c.k + l] * x_conv[i * c.k + l];
        ref += p;
        abs_sum += std::fabs(p);
      }
      const double tol = 8 * std::sqrt(double(c.k)) * 0x1p-24 * abs_sum + 1e-30;
      ASSERT_NEAR(y.f()[i * c.m + j], ref, tol) << "y[" << i << ", " << j << "]";
    }
  }
}

TEST_P(CpuBackendTest, MatMulAllTypesAndShapes) {
  for (DType type : {DType::kF32, DType::kF16, DType::kBF16, DType::kQ8_0}) {
    const bool q = type == DType::kQ8_0;
    const std::vector<MatMulCase> cases = {
        {type, 1, 1, q ? 32 : 1},    {type, 1, 37, q ? 64 : 7},    {type, 3, 5, q ? 96 : 33},
        {type, 5, 9, q ? 160 : 100}, {type, 4, 8, q ? 32 : 9},     {type, 17, 33, 256},
        {type, 1, 300, 4096},        {type, 9, 130, q ? 544 : 515}};
    for (const MatMulCase& c : cases) CheckMatMul(*be_, rng_, c);
  }
}

TEST_P(CpuBackendTest, MatMulQuantizedMatchesUnquantizedApproximately) {
  // Guards against a reference that shares a bug with the backend: Q8_0 and F16 results must stay
  // close to the plain F32 product of the original values.
  const int64_t n = 3, m = 16, k = 512;
  const std::vector<float> wv = RandomVec(rng_, m * k), xv = RandomVec(rng_, n * k);
  HostTensor x = F32(n, k, xv);
  for (DType type : {DType::kF16, DType::kBF16, DType::kQ8_0}) {
    std::vector<double> unused;
    HostTensor w = MakeWeights(type, m, k, wv, &unused);
    HostTensor y(DType::kF32, n, m);
    ASSERT_THAT(be_->MatMul(w.t, x.t, y.t), IsOk());
    const double rel = type == DType::kQ8_0 ? 0.02 : type == DType::kBF16 ? 0.01 : 1e-3;
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t j = 0; j < m; ++j) {
        double ref = 0;
        for (int64_t l = 0; l < k; ++l) ref += double{wv[j * k + l]} * xv[i * k + l];
        EXPECT_NEAR(y.f()[i * m + j], ref, rel * std::sqrt(double(k)))
            << "type " << static_cast<int>(type);
      }
    }
  }
}

TEST(CpuBackendThreadsTest, MatMulBitIdenticalAcrossThreadCounts) {
  std::mt19937 rng(5);
  const int64_t n = 6, m = 1001, k = 1024;
  for (DType type : {DType::kF32, DType::kQ8_0}) {
    std::vector<double> unused;
    HostTensor w = MakeWeights(type, m, k, RandomVec(rng, m * k), &unused);
    HostTensor x = F32(n, k, RandomVec(rng, n * k));
    HostTensor y1(DType::kF32, n, m), y4(DType::kF32, n, m);
    ASSERT_THAT(CreateCpuBackend({.threads = 1})->MatMul(w.t, x.t, y1.t), IsOk());
    ASSERT_THAT(CreateCpuBackend({.threads = 4})->MatMul(w.t, x.t, y4.t), IsOk());
    EXPECT_EQ(std::memcmp(y1.t.data, y4.t.data, y1.t.bytes()), 0);
  }
}

// MatMulGroup runs several matrices of one activation matrix as one loop (decode) or one at a
// time (batches): either way every output must equal its own MatMulRowOrder bit for bit, with
// matrices of different companion types (Q8_0 activations for Q5_0 / Q8_0, Q8_K for Q4_K / Q2_K,
// F16, F32) and row counts that are and are not multiples of the tile and repacking sizes.
TEST_P(CpuBackendTest, MatMulGroupEqualsOneMatMulEach) {
  const int64_t k = 512;
  const DType types[] = {DType::kQ5_0, DType::kQ8_0, DType::kQ4_K, DType::kQ2_K, DType::kF16,
                         DType::kF32};
  const int64_t rows[] = {72, 20, 64, 40, 13, 8};
  std::vector<HostTensor> w;
  for (size_t i = 0; i < std::size(types); ++i) {
    std::vector<double> unused;
    w.push_back(MakeWeights(types[i], rows[i], k, RandomVec(rng_, rows[i] * k), &unused));
  }
  for (int64_t n : {1, 2, 3, 5, 8}) {
    SCOPED_TRACE(::testing::Message() << "n " << n);
    HostTensor x = F32(n, k, RandomVec(rng_, n * k, 2.f));
    std::vector<uint8_t> orders(static_cast<size_t>(n), kRowOrderGemv);
    std::vector<HostTensor> ys, want;
    std::vector<const Tensor*> wp;
    std::vector<Tensor*> yp;
    for (size_t i = 0; i < w.size(); ++i) {
      ys.emplace_back(DType::kF32, n, rows[i]);
      want.emplace_back(DType::kF32, n, rows[i]);
      ASSERT_THAT(be_->MatMulRowOrder(w[i].t, x.t, want[i].t, orders), IsOk());
    }
    for (size_t i = 0; i < w.size(); ++i) {
      wp.push_back(&w[i].t);
      yp.push_back(&ys[i].t);
    }
    // Three companion types at most run in one loop; all six go one at a time.
    ASSERT_THAT(be_->MatMulGroup(absl::MakeConstSpan(wp.data(), 3), x.t,
                                 absl::MakeConstSpan(yp.data(), 3), orders),
                IsOk());
    ASSERT_THAT(be_->MatMulGroup(wp, x.t, yp, orders), IsOk());
    for (size_t i = 0; i < w.size(); ++i) {
      ASSERT_EQ(std::memcmp(ys[i].t.data, want[i].t.data, want[i].t.bytes()), 0)
          << Traits(types[i]).name;
    }
  }
  HostTensor x = F32(1, k, RandomVec(rng_, k));
  HostTensor y(DType::kF32, 1, rows[0]);
  const Tensor* one_w[] = {&w[0].t};
  Tensor* no_y[] = {};
  EXPECT_THAT(be_->MatMulGroup(one_w, x.t, absl::MakeConstSpan(no_y, 0), {kRowOrderGemv}),
              StatusIs(absl::StatusCode::kInvalidArgument));
  Tensor* one_y[] = {&y.t};
  EXPECT_THAT(be_->MatMulGroup(one_w, x.t, one_y, {}),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

// y (x's rows through MatMulRowOrder together) holds, row by row, what a one-row MatMulRowOrder
// of that row with `order` gives, bit for bit.
void ExpectRowsEqualOneRowEach(Backend& be, const Tensor& w, const Tensor& x, const Tensor& y,
                               uint8_t order) {
  for (int64_t r = 0; r < x.rows; ++r) {
    Tensor xr{DType::kF32, x.cols, 1, static_cast<float*>(x.data) + r * x.cols};
    HostTensor yr(DType::kF32, 1, w.rows);
    ASSERT_THAT(be.MatMulRowOrder(w, xr, yr.t, {order}), IsOk());
    ASSERT_EQ(std::memcmp(yr.t.data, static_cast<float*>(y.data) + r * w.rows, w.rows * 4), 0)
        << "row " << r;
  }
}

// A generated token's logits must not depend on how many other rows share its step (decode
// sequences, or the K+1 rows a speculative step verifies): every row of an n-row MatMulRowOrder
// in the one-token order equals a one-row MatMul of that row bit for bit, for row counts that take
// the tiles (1-2), the quad kernels (3-11; 3-16 on AMD Zen 4) and the grouped ones (12+, 17+ on Zen
// 4; past 16 rows with a tail of up to 6 in tiles: 17, 22, not 23) on AVX512-VNNI CPUs, and on AVX2
// alone the tiles (1-4) and for Q8_0 the row kernel (to 16 rows, in passes of 8: 9, 13, 16) and the
// grouped kernel (17+). Q4_K and Q6_K take their five-column tiles for the last five rows (5, 9,
// 13, 17).
TEST_P(CpuBackendTest, DecodeRowsEqualOneRowEach) {
  const int64_t k = 640, m = 72;
  for (DType type : {DType::kQ8_0, DType::kQ5_0, DType::kQ4_K, DType::kQ6_K}) {
    const int64_t kk = (type == DType::kQ4_K || type == DType::kQ6_K) ? 512 : k;
    std::vector<double> unused;
    HostTensor w = MakeWeights(type, m, kk, RandomVec(rng_, m * kk), &unused);
    for (int64_t n : {2, 3, 4, 5, 6, 8, 9, 11, 12, 13, 16, 17, 22, 23}) {
      SCOPED_TRACE(::testing::Message() << Traits(type).name << " n " << n);
      HostTensor x = F32(n, kk, RandomVec(rng_, n * kk, 2.f));
      HostTensor y(DType::kF32, n, m);
      const std::vector<uint8_t> orders(static_cast<size_t>(n), kRowOrderGemv);
      ASSERT_THAT(be_->MatMulRowOrder(w.t, x.t, y.t, orders), IsOk());
      ExpectRowsEqualOneRowEach(*be_, w.t, x.t, y.t, kRowOrderGemv);
    }
  }
}

// Whether the default (SIMD) table runs pdserve's own order for weights of `type` (and lays them
// out for it): AVX512-VNNI for Q8_0, Q5_0, Q4_K and Q6_K; AVX2 alone for all but Q6_K.
bool SimdRunsOwnOrder(DType type) {
  switch (type) {
    case DType::kQ8_0:
      return cpu::Q8_0x16OwnOrderVnni() != nullptr || cpu::Q8_0x16OwnOrderAvx2() != nullptr;
    case DType::kQ5_0:
      return cpu::Q5_0x16OwnOrderVnni() != nullptr || cpu::Q5_0x16OwnOrderAvx2() != nullptr;
    case DType::kQ4_K:
      return cpu::Q4_Kx16OwnOrderVnni() != nullptr || cpu::Q4_Kx16OwnOrderAvx2() != nullptr;
    case DType::kQ6_K:
      return cpu::Q6_Kx16OwnOrderVnni() != nullptr;
    default:
      return false;
  }
}

// Rows marked kRowOrderOwn (the output head over an F16 or INT8 cache) take pdserve's own Q8_0
// order where the backend runs it (AVX512-VNNI, AVX2, the scalar table): a row gets the same bits
// alone and in a batch (1 to 40 rows: one and several passes of 16 activation rows; 77 weight
// rows, off the 16-row groups), and they are the portable kernel's bits (cpu::Q8_0OwnOrderScalar
// over the activations the backend quantizes with QuantizeRowQ8_0Act). Weights without an own
// order (Q4_0) ignore the flag; the flag on some rows only is refused.
TEST_P(CpuBackendTest, OwnOrderRowsEqualOneRowEachAndThePortableKernel) {
  const bool runs_own = GetParam().force_scalar || SimdRunsOwnOrder(DType::kQ8_0);
  const int64_t k = 640, m = 77, nb = k / 32;
  std::vector<double> unused;
  HostTensor w = MakeWeights(DType::kQ8_0, m, k, RandomVec(rng_, m * k), &unused);
  const uint8_t own = kRowOrderGemv | kRowOrderOwn;
  const cpu::GroupedKernels* portable = cpu::Q8_0OwnOrderScalar();
  for (int64_t n : {1, 3, 16, 17, 40}) {
    SCOPED_TRACE(::testing::Message() << "n " << n);
    HostTensor x = F32(n, k, RandomVec(rng_, n * k, 2.f));
    HostTensor y(DType::kF32, n, m);
    ASSERT_THAT(be_->MatMulRowOrder(w.t, x.t, y.t, std::vector<uint8_t>(n, own)), IsOk());
    std::vector<BlockQ8_0> xq(n * nb);
    for (int64_t r = 0; r < n; ++r) {
      QuantizeRowQ8_0Act(static_cast<const float*>(x.t.data) + r * k, xq.data() + r * nb, k);
    }
    std::vector<char> packed(portable->x_bytes(n, k));
    portable->pack_x(xq.data(), nb * sizeof(BlockQ8_0), n, k, packed.data());
    std::vector<float> want(n * m);
    if (runs_own) {
      portable->gemm(k, w.t.data, w.t.row_bytes(), m, packed.data(), n, want.data(), m);
    } else {
      Tensor yw{DType::kF32, m, n, want.data()};
      ASSERT_THAT(be_->MatMulRowOrder(w.t, x.t, yw, std::vector<uint8_t>(n, kRowOrderGemv)),
                  IsOk());
    }
    ASSERT_EQ(std::memcmp(want.data(), y.t.data, want.size() * 4), 0);
    ExpectRowsEqualOneRowEach(*be_, w.t, x.t, y.t, own);
  }
  HostTensor x = F32(4, k, RandomVec(rng_, 4 * k, 2.f));
  HostTensor y(DType::kF32, 4, m), y_plain(DType::kF32, 4, m);
  EXPECT_THAT(be_->MatMulRowOrder(w.t, x.t, y.t, {own, own, kRowOrderGemv, own}),
              StatusIs(absl::StatusCode::kInvalidArgument, "own order"));
  HostTensor w4 = MakeWeights(DType::kQ4_0, m, k, RandomVec(rng_, m * k), &unused);
  ASSERT_THAT(be_->MatMulRowOrder(w4.t, x.t, y.t, std::vector<uint8_t>(4, own)), IsOk());
  ASSERT_THAT(be_->MatMulRowOrder(w4.t, x.t, y_plain.t, std::vector<uint8_t>(4, kRowOrderGemv)),
              IsOk());
  EXPECT_EQ(std::memcmp(y.t.data, y_plain.t.data, y.t.bytes()), 0);
}

// MapWeightsOwnLayout: a Q8_0 matrix as q8_0x16 where the backend runs the own order (VNNI, or the
// portable kernels on any CPU). MatMul over it gives every row the own order with or without the
// flag, the bits of the file's rows with it (77 rows: four groups of 16 and 13 plain rows after,
// split over chunks and threads); GetRows gives the rows' values. None for another type, with
// weight copies off (PDSERVE_CPU_WEIGHTS=mmap) or past their budget.
TEST_P(CpuBackendTest, OwnLayoutGivesTheFlagsBitsAndTheRows) {
  const int64_t k = 640, m = 77;
  std::vector<double> unused;
  HostTensor w = MakeWeights(DType::kQ8_0, m, k, RandomVec(rng_, m * k), &unused);
  std::unique_ptr<Buffer> storage;
  absl::StatusOr<Tensor> laid = be_->MapWeightsOwnLayout(w.t, &storage);
  ASSERT_THAT(laid.status(), IsOk());
  if (!GetParam().force_scalar && !SimdRunsOwnOrder(DType::kQ8_0)) {
    EXPECT_EQ(laid->data, nullptr) << "no own order here: no layout for it";
    GTEST_SKIP() << "no own-order kernels for Q8_0 on this CPU: llama.cpp's order";
  }
  ASSERT_NE(laid->data, nullptr);
  ASSERT_NE(storage, nullptr);
  EXPECT_EQ(laid->type, DType::kQ8_0x16);
  EXPECT_EQ(laid->rows, m);
  EXPECT_EQ(laid->bytes(), w.t.bytes());
  const uint8_t own = kRowOrderGemv | kRowOrderOwn;
  for (int64_t n : {1, 2, 3, 16, 17, 40}) {
    SCOPED_TRACE(::testing::Message() << "n " << n);
    HostTensor x = F32(n, k, RandomVec(rng_, n * k, 2.f));
    HostTensor want(DType::kF32, n, m), got(DType::kF32, n, m), got_flagged(DType::kF32, n, m);
    ASSERT_THAT(be_->MatMulRowOrder(w.t, x.t, want.t, std::vector<uint8_t>(n, own)), IsOk());
    ASSERT_THAT(be_->MatMul(*laid, x.t, got.t), IsOk());
    ASSERT_THAT(be_->MatMulRowOrder(*laid, x.t, got_flagged.t, std::vector<uint8_t>(n, own)),
                IsOk());
    EXPECT_EQ(std::memcmp(want.t.data, got.t.data, want.t.bytes()), 0);
    EXPECT_EQ(std::memcmp(want.t.data, got_flagged.t.data, want.t.bytes()), 0);
  }
  const std::vector<int32_t> ids = {0, 15, 16, 31, 63, 64, 65, 76, 5};
  HostTensor rows(DType::kF32, static_cast<int64_t>(ids.size()), k);
  HostTensor rows_plain(DType::kF32, static_cast<int64_t>(ids.size()), k);
  ASSERT_THAT(be_->GetRows(*laid, ids, rows.t), IsOk());
  ASSERT_THAT(be_->GetRows(w.t, ids, rows_plain.t), IsOk());
  EXPECT_EQ(std::memcmp(rows.t.data, rows_plain.t.data, rows.t.bytes()), 0);

  HostTensor w5 = MakeWeights(DType::kQ5_0, m, k, RandomVec(rng_, m * k), &unused);
  absl::StatusOr<Tensor> none = be_->MapWeightsOwnLayout(w5.t, &storage);
  ASSERT_THAT(none.status(), IsOk());
  EXPECT_EQ(none->data, nullptr);
  EXPECT_EQ(storage, nullptr);
  for (const CpuBackendOptions& o :
       {CpuBackendOptions{.force_scalar = GetParam().force_scalar, .copy_weights = false},
        CpuBackendOptions{.force_scalar = GetParam().force_scalar,
        .copy_weights_max_bytes = w.t.bytes() / 2}}) {
    std::unique_ptr<Backend> be = CreateCpuBackend(o);
    absl::StatusOr<Tensor> kept = be->MapWeightsOwnLayout(w.t, &storage);
    ASSERT_THAT(kept.status(), IsOk());
    EXPECT_EQ(kept->data, nullptr) << o.copy_weights;
  }
}

// Q5_0 laid out as q5_0x16 and Q4_K as q4_Kx16 (rows a multiple of 16): the bits the flag gives
// on the plain rows, for every batch size, each row's the same as alone, near llama.cpp's order
// (Q4_K: the same sums in another order); rows from GetRows as from the plain rows; the flag on
// plain rows of any count gives the portable kernel's bits; other row counts, copies off and a
// budget too small keep the plain rows.
void ExpectOwnLayoutGivesTheFlagsBitsAndTheRows(Backend& be, bool force_scalar, std::mt19937& rng,
                                                DType type, DType laid_type,
                                                std::initializer_list<int64_t> ks) {
  std::vector<double> unused;
  const uint8_t own = kRowOrderGemv | kRowOrderOwn;
  std::unique_ptr<Backend> portable = CreateCpuBackend({.force_scalar = true});
  Backend* const be_ = &be;
  for (int64_t k : ks) {
    const int64_t m = 80;
    SCOPED_TRACE(::testing::Message() << Traits(type).name << " k " << k);
    HostTensor w = MakeWeights(type, m, k, RandomVec(rng, m * k), &unused);
    std::unique_ptr<Buffer> storage;
    absl::StatusOr<Tensor> laid = be_->MapWeightsOwnLayout(w.t, &storage);
    ASSERT_THAT(laid.status(), IsOk());
    if (!force_scalar && !SimdRunsOwnOrder(type)) {
      EXPECT_EQ(laid->data, nullptr) << "no own order here: no layout for it";
      GTEST_SKIP() << "no own-order kernels for " << Traits(type).name
                   << " on this CPU (Q6_K on AVX2 alone): llama.cpp's order";
    }
    ASSERT_NE(laid->data, nullptr);
    ASSERT_NE(storage, nullptr);
    EXPECT_EQ(laid->type, laid_type);
    EXPECT_EQ(laid->bytes(), type == DType::kQ4_K ? w.t.bytes() / 144 * 148 : w.t.bytes());
    for (int64_t n : {1, 2, 3, 4, 5, 16, 17, 40}) {
      SCOPED_TRACE(::testing::Message() << "n " << n);
      HostTensor x = F32(n, k, RandomVec(rng, n * k, 2.f));
      HostTensor want(DType::kF32, n, m), got(DType::kF32, n, m), got_flagged(DType::kF32, n, m);
      HostTensor ref(DType::kF32, n, m);
      ASSERT_THAT(be_->MatMulRowOrder(w.t, x.t, want.t, std::vector<uint8_t>(n, own)), IsOk());
      ASSERT_THAT(portable->MatMulRowOrder(w.t, x.t, ref.t, std::vector<uint8_t>(n, own)), IsOk());
      ASSERT_THAT(be_->MatMul(*laid, x.t, got.t), IsOk());
      ASSERT_THAT(be_->MatMulRowOrder(*laid, x.t, got_flagged.t, std::vector<uint8_t>(n, own)),
                  IsOk());
      EXPECT_EQ(std::memcmp(want.t.data, ref.t.data, want.t.bytes()), 0);
      EXPECT_EQ(std::memcmp(want.t.data, got.t.data, want.t.bytes()), 0);
      EXPECT_EQ(std::memcmp(want.t.data, got_flagged.t.data, want.t.bytes()), 0);
      HostTensor theirs(DType::kF32, n, m);
      ASSERT_THAT(be_->MatMul(w.t, x.t, theirs.t), IsOk());
      const auto* a = static_cast<const float*>(want.t.data);
      const auto* b = static_cast<const float*>(theirs.t.data);
      double diff = 0, norm = 0;
      for (int64_t i = 0; i < n * m; ++i) {
        diff += (double{a[i]} - b[i]) * (double{a[i]} - b[i]);
        norm += double{b[i]} * b[i];
      }
      // Both orders sum the same integers; only the F32 roundings differ (~k / 32 of u each).
      EXPECT_LT(std::sqrt(diff / norm), 1e-5);
      for (int64_t i = 0; i < n; i += 7) {
        const float* xi = static_cast<const float*>(x.t.data) + i * k;
        HostTensor one = F32(1, k, std::vector<float>(xi, xi + k));
        HostTensor y1(DType::kF32, 1, m);
        ASSERT_THAT(be_->MatMul(*laid, one.t, y1.t), IsOk());
        EXPECT_EQ(std::memcmp(y1.t.data, static_cast<const float*>(want.t.data) + i * m,
                              m * sizeof(float)),
                  0)
            << i;
      }
    }
    const std::vector<int32_t> ids = {0, 15, 16, 31, 63, 64, 79, 5};
    HostTensor rows(DType::kF32, static_cast<int64_t>(ids.size()), k);
    HostTensor rows_plain(DType::kF32, static_cast<int64_t>(ids.size()), k);
    ASSERT_THAT(be_->GetRows(*laid, ids, rows.t), IsOk());
    ASSERT_THAT(be_->GetRows(w.t, ids, rows_plain.t), IsOk());
    EXPECT_EQ(std::memcmp(rows.t.data, rows_plain.t.data, rows.t.bytes()), 0);
  }
  // A row count off the groups: no layout; the flag on its plain rows (a part group padded).
  const int64_t k = *ks.begin(), m = 77, n = 5;
  HostTensor w = MakeWeights(type, m, k, RandomVec(rng, m * k), &unused);
  std::unique_ptr<Buffer> storage;
  absl::StatusOr<Tensor> none = be_->MapWeightsOwnLayout(w.t, &storage);
  ASSERT_THAT(none.status(), IsOk());
  EXPECT_EQ(none->data, nullptr);
  EXPECT_EQ(storage, nullptr);
  HostTensor x = F32(n, k, RandomVec(rng, n * k, 2.f));
  HostTensor got(DType::kF32, n, m), ref(DType::kF32, n, m);
  ASSERT_THAT(be_->MatMulRowOrder(w.t, x.t, got.t, std::vector<uint8_t>(n, own)), IsOk());
  ASSERT_THAT(portable->MatMulRowOrder(w.t, x.t, ref.t, std::vector<uint8_t>(n, own)), IsOk());
  EXPECT_EQ(std::memcmp(got.t.data, ref.t.data, got.t.bytes()), 0);
  HostTensor w80 = MakeWeights(type, 80, k, RandomVec(rng, 80 * k), &unused);
  for (const CpuBackendOptions& o :
       {CpuBackendOptions{.force_scalar = force_scalar, .copy_weights = false},
        CpuBackendOptions{.force_scalar = force_scalar,
        .copy_weights_max_bytes = w80.t.bytes() / 2}}) {
    std::unique_ptr<Backend> be = CreateCpuBackend(o);
    absl::StatusOr<Tensor> kept = be->MapWeightsOwnLayout(w80.t, &storage);
    ASSERT_THAT(kept.status(), IsOk());
    EXPECT_EQ(kept->data, nullptr) << o.copy_weights;
  }
}

TEST_P(CpuBackendTest, OwnLayoutQ5_0GivesTheFlagsBitsAndTheRows) {
  ExpectOwnLayoutGivesTheFlagsBitsAndTheRows(*be_, GetParam().force_scalar, rng_, DType::kQ5_0,
                                             DType::kQ5_0x16, {96, 640});
}

TEST_P(CpuBackendTest, OwnLayoutQ4_KGivesTheFlagsBitsAndTheRows) {
  ExpectOwnLayoutGivesTheFlagsBitsAndTheRows(*be_, GetParam().force_scalar, rng_, DType::kQ4_K,
                                             DType::kQ4_Kx16, {256, 2048});
}

TEST_P(CpuBackendTest, OwnLayoutQ6_KGivesTheFlagsBitsAndTheRows) {
  ExpectOwnLayoutGivesTheFlagsBitsAndTheRows(*be_, GetParam().force_scalar, rng_, DType::kQ6_K,
                                             DType::kQ6_Kx16, {256, 2048});
}

TEST_P(CpuBackendTest, MatMulValidation) {
  HostTensor w(DType::kQ8_0, 4, 64), x(DType::kF32, 2, 64), y(DType::kF32, 2, 4);
  EXPECT_THAT(be_->MatMul(w.t, x.t, y.t), IsOk());
  HostTensor x_bad(DType::kF32, 2, 32);
  EXPECT_THAT(be_->MatMul(w.t, x_bad.t, y.t), StatusIs(absl::StatusCode::kInvalidArgument));
  HostTensor y_bad(DType::kF32, 3, 4);
  EXPECT_THAT(be_->MatMul(w.t, x.t, y_bad.t), StatusIs(absl::StatusCode::kInvalidArgument));
  HostTensor y_bad2(DType::kF32, 2, 5);
  EXPECT_THAT(be_->MatMul(w.t, x.t, y_bad2.t), StatusIs(absl::StatusCode::kInvalidArgument));
  HostTensor x_f16(DType::kF16, 2, 64);
  EXPECT_THAT(be_->MatMul(w.t, x_f16.t, y.t), StatusIs(absl::StatusCode::kUnimplemented));
  Tensor w_q4 = w.t;
  w_q4.type = static_cast<DType>(3);  // ggml q4_1: not supported
  EXPECT_THAT(be_->MatMul(w_q4, x.t, y.t), StatusIs(absl::StatusCode::kUnimplemented, "q4_1"));
  Tensor w_q8k = w.t;
  w_q8k.type = DType::kQ8_K;  // activations only: no matmul
  w_q8k.cols = 256;
  EXPECT_THAT(be_->MatMul(w_q8k, x.t, y.t), StatusIs(absl::StatusCode::kUnimplemented, "q8_K"));
  Tensor w_cols = w.t;
  w_cols.cols = 48;  // not a whole number of Q8_0 blocks
  Tensor x48 = x.t;
  x48.cols = 48;
  EXPECT_THAT(be_->MatMul(w_cols, x48, y.t), StatusIs(absl::StatusCode::kInvalidArgument));
  Tensor null_x = x.t;
  null_x.data = nullptr;
  EXPECT_THAT(be_->MatMul(w.t, null_x, y.t), StatusIs(absl::StatusCode::kInvalidArgument));
  Tensor y_alias = x.t;  // y over x's memory
  y_alias.cols = 4;
  EXPECT_THAT(be_->MatMul(w.t, x.t, y_alias), StatusIs(absl::StatusCode::kInvalidArgument));
}

// ---- GetRows -------------------------------------------------------------------------------

TEST_P(CpuBackendTest, GetRowsAllTypes) {
  const int64_t rows = 11, cols = 96;
  const std::vector<float> v = RandomVec(rng_, rows * cols);
  const std::vector<int32_t> ids = {3, 0, 10, 3, 7};
  for (DType type : {DType::kF32, DType::kF16, DType::kBF16, DType::kQ8_0}) {
    std::vector<double> exact;
    HostTensor table = MakeWeights(type, rows, cols, v, &exact);
    HostTensor out(DType::kF32, ids.size(), cols);
    ASSERT_THAT(be_->GetRows(table.t, ids, out.t), IsOk());
    for (size_t i = 0; i < ids.size(); ++i) {
      for (int64_t c = 0; c < cols; ++c) {
        ASSERT_EQ(out.f()[i * cols + c], exact[ids[i] * cols + c]) << "type " << int(type);
      }
    }
    const std::vector<int32_t> bad = {0, 11};
    HostTensor out2(DType::kF32, 2, cols);
    EXPECT_THAT(be_->GetRows(table.t, bad, out2.t), StatusIs(absl::StatusCode::kInvalidArgument));
    const std::vector<int32_t> neg = {-1, 0};
    EXPECT_THAT(be_->GetRows(table.t, neg, out2.t), StatusIs(absl::StatusCode::kInvalidArgument));
    EXPECT_THAT(be_->GetRows(table.t, ids, out2.t), StatusIs(absl::StatusCode::kInvalidArgument));
  }
}

// ---- RmsNorm -------------------------------------------------------------------------------

TEST_P(CpuBackendTest, SoftcapIsGgmlsFormulaExactly) {
  const int64_t rows = 3, cols = 4099;  // more than one thread's grain
  const std::vector<float> xv = RandomVec(rng_, rows * cols, 100.f);
  HostTensor x = F32(rows, cols, xv), y(DType::kF32, rows, cols);
  const float cap = 30.f;
  ASSERT_THAT(be_->Softcap(x.t, cap, y.t), IsOk());
  for (int64_t i = 0; i < rows * cols; ++i) {
    // ggml: scale by 1/cap, tanhf, scale by cap; the same float operations give the same bits.
    ASSERT_EQ(y.f()[i], std::tanh(xv[i] * (1.0f / cap)) * cap) << i;
    ASSERT_LE(std::fabs(y.f()[i]), cap);
  }
  ASSERT_THAT(be_->Softcap(x.t, cap, x.t), IsOk());  // in place
  EXPECT_EQ(std::memcmp(x.t.data, y.t.data, x.t.bytes()), 0);
  EXPECT_THAT(be_->Softcap(x.t, 0.f, y.t), StatusIs(absl::StatusCode::kInvalidArgument));
  HostTensor other(DType::kF32, rows, cols + 1);
  EXPECT_THAT(be_->Softcap(x.t, cap, other.t), StatusIs(absl::StatusCode::kInvalidArgument));
}

// MoeCombine: each output row sums its k slots in slot order, product then add, both rounded to
// F32: the same float operations in the same order, hence the same bits.
TEST_P(CpuBackendTest, MoeCombineSumsSlotsInOrderExactly) {
  const int k = 3;
  const int64_t n_out = 5, m = 9, cols = 4099;  // more than one thread's grain per row
  const std::vector<float> rv = RandomVec(rng_, m * cols, 3.f);
  HostTensor rows = F32(m, cols, rv), y(DType::kF32, n_out, cols);
  std::vector<int32_t> index(n_out * k);
  std::vector<float> weights(n_out * k);
  for (size_t i = 0; i < index.size(); ++i) {
    index[i] = static_cast<int32_t>((i * 7 + 3) % m);
    weights[i] = 0.1f + 0.3f * static_cast<float>(i % 4);
  }
  ASSERT_THAT(be_->MoeCombine(rows.t, index, weights, k, y.t), IsOk());
  for (int64_t r = 0; r < n_out; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      float acc = rv[index[r * k] * cols + c] * weights[r * k];
      for (int j = 1; j < k; ++j) {
        const float prod = rv[index[r * k + j] * cols + c] * weights[r * k + j];
        acc = acc + prod;
      }
      ASSERT_EQ(y.f()[r * cols + c], acc) << r << "," << c;
    }
  }
  // k = 1 copies the scaled row.
  HostTensor y1(DType::kF32, 2, cols);
  const std::vector<int32_t> one = {4, 0};
  const std::vector<float> w1 = {1.f, 0.5f};
  ASSERT_THAT(be_->MoeCombine(rows.t, one, w1, 1, y1.t), IsOk());
  for (int64_t c = 0; c < cols; ++c) {
    ASSERT_EQ(y1.f()[c], rv[4 * cols + c]);
    ASSERT_EQ(y1.f()[cols + c], rv[c] * 0.5f);
  }
  // Bad calls.
  std::vector<int32_t> out_of_range = index;
  out_of_range[4] = static_cast<int32_t>(m);
  EXPECT_THAT(be_->MoeCombine(rows.t, out_of_range, weights, k, y.t),
              StatusIs(absl::StatusCode::kInvalidArgument, "index[4] = 9 is outside the 9 rows"));
  EXPECT_THAT(be_->MoeCombine(rows.t, index, weights, 2, y.t),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(be_->MoeCombine(rows.t, index, absl::MakeConstSpan(weights).subspan(1), k, y.t),
              StatusIs(absl::StatusCode::kInvalidArgument));
  HostTensor narrow(DType::kF32, n_out, cols - 1);
  EXPECT_THAT(be_->MoeCombine(rows.t, index, weights, k, narrow.t),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(be_->MoeCombine(rows.t, std::vector<int32_t>(m * 1, 0), std::vector<float>(m, 1.f),
                              1, rows.t),
              StatusIs(absl::StatusCode::kInvalidArgument, "aliases"));
}

TEST_P(CpuBackendTest, RmsNormWithAndWithoutWeight) {
  for (int64_t cols : {1, 7, 64, 4099}) {
    const int64_t rows = 5;
    const std::vector<float> xv = RandomVec(rng_, rows * cols, 4.f);
    const std::vector<float> wv = RandomVec(rng_, cols);
    HostTensor x = F32(rows, cols, xv), w = F32(1, cols, wv);
    HostTensor y(DType::kF32, rows, cols);
    const float eps = 1e-5f;
    for (bool weighted : {false, true}) {
      Tensor wt = w.t;
      if (!weighted) wt.data = nullptr;
      ASSERT_THAT(be_->RmsNorm(x.t, wt, eps, y.t), IsOk());
      for (int64_t r = 0; r < rows; ++r) {
        double ss = 0;
        for (int64_t c = 0; c < cols; ++c) ss += double{xv[r * cols + c]} * xv[r * cols + c];
        const double s = 1 / std::sqrt(ss / cols + eps);
        for (int64_t c = 0; c < cols; ++c) {
          const double ref = xv[r * cols + c] * s * (weighted ? wv[c] : 1.0);
          ASSERT_NEAR(y.f()[r * cols + c], ref, 1e-6 * std::fabs(ref) + 1e-30);
        }
      }
    }
    // In place gives the same bits as out of place (y holds the weighted result).
    ASSERT_THAT(be_->RmsNorm(x.t, w.t, eps, x.t), IsOk());
    EXPECT_EQ(std::memcmp(x.t.data, y.t.data, x.t.bytes()), 0);
  }
  HostTensor x(DType::kF32, 2, 8), w(DType::kF32, 1, 7), y(DType::kF32, 2, 8);
  EXPECT_THAT(be_->RmsNorm(x.t, w.t, 1e-5f, y.t), StatusIs(absl::StatusCode::kInvalidArgument));
  HostTensor y2(DType::kF32, 3, 8);
  Tensor none = w.t;
  none.data = nullptr;
  EXPECT_THAT(be_->RmsNorm(x.t, none, 1e-5f, y2.t), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(be_->RmsNorm(x.t, none, -1.f, y.t), StatusIs(absl::StatusCode::kInvalidArgument));
}

// ---- Rope ----------------------------------------------------------------------------------

void RopeReference(std::vector<double>& x, int n_heads, const std::vector<int32_t>& pos,
                   const RopeParams& p) {
  const int half = p.rot_dim / 2;
  for (size_t t = 0; t < pos.size(); ++t) {
    for (int h = 0; h < n_heads; ++h) {
      double* v = x.data() + (t * n_heads + h) * p.head_dim;
      for (int i = 0; i < half; ++i) {
        double theta =
            pos[t] * double{p.freq_scale} * std::pow(double{p.freq_base}, -2.0 * i / p.rot_dim);
        if (!p.freq_factors.empty()) theta /= p.freq_factors[i];
        const int a = p.mode == RopeMode::kNeox ? i : 2 * i;
        const int b = p.mode == RopeMode::kNeox ? i + half : 2 * i + 1;
        const double x0 = v[a], x1 = v[b];
        v[a] = x0 * std::cos(theta) - x1 * std::sin(theta);
        v[b] = x0 * std::sin(theta) + x1 * std::cos(theta);
      }
    }
  }
}

TEST_P(CpuBackendTest, RopeBothModesWithFreqFactors) {
  const int n_heads = 3;
  for (RopeMode mode : {RopeMode::kNormal, RopeMode::kNeox}) {
    for (int head_dim : {8, 64, 40}) {
      for (bool factors : {false, true}) {
        for (bool large_pos : {false, true}) {
          RopeParams p;
          p.mode = mode;
          p.head_dim = head_dim;
          p.rot_dim = head_dim == 40 ? 24 : head_dim;  // partial rotation leaves the tail alone
          p.freq_base = 500000.f;
          p.freq_scale = 0.5f;
          std::vector<float> ff(p.rot_dim / 2);
          for (size_t i = 0; i < ff.size(); ++i) ff[i] = 1.f + i * 0.75f;
          if (factors) p.freq_factors = ff;
          const std::vector<int32_t> pos = large_pos ? std::vector<int32_t>{4097, 0, 32000, 12345}
                                                     : std::vector<int32_t>{0, 1, 5, 15};
          const int64_t cols = int64_t{n_heads} * head_dim;
          const std::vector<float> xv = RandomVec(rng_, pos.size() * cols);
          HostTensor x = F32(pos.size(), cols, xv);
          ASSERT_THAT(be_->Rope(x.t, n_heads, pos, p), IsOk());
          std::vector<double> ref(xv.begin(), xv.end());
          RopeReference(ref, n_heads, pos, p);
          for (size_t t = 0; t < pos.size(); ++t) {
            for (int64_t c = 0; c < cols; ++c) {
              const size_t i = t * cols + c;
              const double tol = (2e-6 + pos[t] * std::fabs(p.freq_scale) * 1e-6) * 2;
              ASSERT_NEAR(x.f()[i], ref[i], tol) << "mode " << int(mode) << " hd " << head_dim
                                                 << " ff " << factors << " t " << t << " c " << c;
              if (c % head_dim >= p.rot_dim) {
                ASSERT_EQ(x.f()[i], xv[i]);
              }
            }
          }
        }
      }
    }
  }
}

TEST_P(CpuBackendTest, RopeModesDiffer) {
  // A known rotation: pos 1, base 1 -> every angle is 1 rad; the pair layout decides which
  // elements mix.
  RopeParams p;
  p.head_dim = p.rot_dim = 4;
  p.freq_base = 1.f;
  const std::vector<int32_t> pos = {1};
  HostTensor a = F32(1, 4, {1, 0, 0, 0}), b = F32(1, 4, {1, 0, 0, 0});
  ASSERT_THAT(be_->Rope(a.t, 1, pos, p), IsOk());
  p.mode = RopeMode::kNeox;
  ASSERT_THAT(be_->Rope(b.t, 1, pos, p), IsOk());
  const float c = std::cos(1.f), s = std::sin(1.f);
  EXPECT_NEAR(a.f()[0], c, 1e-6);
  EXPECT_NEAR(a.f()[1], s, 1e-6);  // normal: (0, 1) pair
  EXPECT_EQ(a.f()[2], 0.f);
  EXPECT_NEAR(b.f()[0], c, 1e-6);
  EXPECT_EQ(b.f()[1], 0.f);
  EXPECT_NEAR(b.f()[2], s, 1e-6);  // neox: (0, 2) pair
}

TEST_P(CpuBackendTest, RopeValidation) {
  HostTensor x(DType::kF32, 2, 16);
  const std::vector<int32_t> pos = {0, 1};
  RopeParams p;
  p.head_dim = 8;
  p.rot_dim = 8;
  EXPECT_THAT(be_->Rope(x.t, 2, pos, p), IsOk());
  EXPECT_THAT(be_->Rope(x.t, 3, pos, p), StatusIs(absl::StatusCode::kInvalidArgument));
  const std::vector<int32_t> pos3 = {0, 1, 2};
  EXPECT_THAT(be_->Rope(x.t, 2, pos3, p), StatusIs(absl::StatusCode::kInvalidArgument));
  p.rot_dim = 7;
  EXPECT_THAT(be_->Rope(x.t, 2, pos, p), StatusIs(absl::StatusCode::kInvalidArgument));
  p.rot_dim = 10;
  EXPECT_THAT(be_->Rope(x.t, 2, pos, p), StatusIs(absl::StatusCode::kInvalidArgument));
  p.rot_dim = 8;
  const std::vector<float> ff(3, 1.f);
  p.freq_factors = ff;
  EXPECT_THAT(be_->Rope(x.t, 2, pos, p), StatusIs(absl::StatusCode::kInvalidArgument));
  HostTensor xh(DType::kF16, 2, 16);
  p.freq_factors = {};
  EXPECT_THAT(be_->Rope(xh.t, 2, pos, p), StatusIs(absl::StatusCode::kUnimplemented));
}

// ---- elementwise ---------------------------------------------------------------------------

TEST_P(CpuBackendTest, AddAddBiasSwiGlu) {
  for (int64_t cols : {1, 9, 4096, 40000}) {
    const int64_t rows = 3;
    const std::vector<float> av = RandomVec(rng_, rows * cols, 5.f),
                             bv = RandomVec(rng_, rows * cols, 5.f);
    const std::vector<float> biasv = RandomVec(rng_, cols);
    HostTensor a = F32(rows, cols, av), b = F32(rows, cols, bv), bias = F32(1, cols, biasv);
    HostTensor y(DType::kF32, rows, cols);
    ASSERT_THAT(be_->Add(a.t, b.t, y.t), IsOk());
    for (int64_t i = 0; i < rows * cols; ++i) ASSERT_EQ(y.f()[i], av[i] + bv[i]);
    ASSERT_THAT(be_->SwiGlu(a.t, b.t, y.t), IsOk());
    for (int64_t i = 0; i < rows * cols; ++i) {
      const double ref = av[i] / (1 + std::exp(-double{av[i]})) * bv[i];
      ASSERT_NEAR(y.f()[i], ref, 1e-6 * std::fabs(ref) + 1e-30);
    }
    ASSERT_THAT(be_->AddBias(a.t, bias.t, a.t), IsOk());  // in place
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c)
        ASSERT_EQ(a.f()[r * cols + c], av[r * cols + c] + biasv[c]);
  }
  HostTensor a(DType::kF32, 2, 8), b(DType::kF32, 2, 9), bias(DType::kF32, 2, 8);
  EXPECT_THAT(be_->Add(a.t, b.t, a.t), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(be_->SwiGlu(a.t, b.t, a.t), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(be_->AddBias(a.t, bias.t, a.t), StatusIs(absl::StatusCode::kInvalidArgument));
  HostTensor h(DType::kBF16, 2, 8);
  EXPECT_THAT(be_->Add(a.t, h.t, a.t), StatusIs(absl::StatusCode::kUnimplemented));
}

TEST_P(CpuBackendTest, GeGluMatchesTheF16Table) {
  // ggml's GELU: x narrowed to f16, looked up in a table of f16 results; +0 below -10 (not
  // multiplied by up), x above 10. The table holds (0.5 x)(1 + tanh((c x)(1 + (a x) x))) with
  // 1 + (a x) x one FMA: the rounding of llama.cpp's build (GCC fuses that product).
  auto ref = [](float g) {
    if (g >= 10.f) return g;
    const float x = F16ToF32(F32ToF16(g));
    const float v = (0.5f * x) * (1.f + std::tanh((0.79788456080286535588f * x) *
                                                  std::fma(0.044715f * x, x, 1.f)));
    return F16ToF32(F32ToF16(v));
  };
  for (int64_t cols : {1, 9, 300, 40000}) {
    const int64_t rows = 3;
    std::vector<float> gv = RandomVec(rng_, rows * cols, 12.f);
    const std::vector<float> uv = RandomVec(rng_, rows * cols, 2.f);
    gv[0] = -10.f, gv[rows * cols - 1] = 10.f;
    HostTensor g = F32(rows, cols, gv), u = F32(rows, cols, uv);
    HostTensor y(DType::kF32, rows, cols);
    ASSERT_THAT(be_->GeGlu(g.t, u.t, y.t), IsOk());
    for (int64_t i = 0; i < rows * cols; ++i) {
      const float want = gv[i] <= -10.f ? 0.f : ref(gv[i]) * uv[i];
      ASSERT_EQ(std::bit_cast<uint32_t>(y.f()[i]), std::bit_cast<uint32_t>(want)) << gv[i];
    }
    ASSERT_THAT(be_->GeGlu(g.t, u.t, g.t), IsOk());  // y aliasing the gate
    for (int64_t i = 0; i < rows * cols; ++i) ASSERT_EQ(g.f()[i], y.f()[i]);
  }
}

TEST_P(CpuBackendTest, SoftmaxStableAndMasked) {
  for (int64_t cols : {1, 5, 8, 100, 1025}) {
    const int64_t rows = 4;
    std::vector<float> v = RandomVec(rng_, rows * cols, 10.f);
    v[0] = 1000.f;  // would overflow a naive exp
    if (cols > 3) v[cols + 1] = -std::numeric_limits<float>::infinity();  // masked
    for (int64_t c = 0; c < cols; ++c) v[3 * cols + c] = -std::numeric_limits<float>::infinity();
    HostTensor x = F32(rows, cols, v);
    ASSERT_THAT(be_->Softmax(x.t), IsOk());
    for (int64_t r = 0; r < rows; ++r) {
      double m = -INFINITY, sum = 0;
      for (int64_t c = 0; c < cols; ++c) m = std::max(m, double{v[r * cols + c]});
      for (int64_t c = 0; c < cols; ++c) sum += std::exp(v[r * cols + c] - m);
      for (int64_t c = 0; c < cols; ++c) {
        if (r == 3) {  // all masked: zeros, not NaN
          ASSERT_EQ(x.f()[r * cols + c], 0.f);
          continue;
        }
        const double ref = std::exp(v[r * cols + c] - m) / sum;
        // x - max is rounded in F32 (as in ggml): a relative error of |x - max| * 2^-24.
        const double rel = ref == 0 ? 0 : 1e-6 + std::fabs(v[r * cols + c] - m) * 0x1p-23;
        ASSERT_NEAR(x.f()[r * cols + c], ref, rel * ref + 1e-30) << r << "," << c;
      }
    }
  }
}

// ---- KV cache and attention ----------------------------------------------------------------

// Host storage for one layer's K or V cache (kv_layout.h).
struct HostKv {
  std::vector<char> bytes;
  KvTensor t;
  HostKv(KvDType type, int n_blocks, int block_size, int n_kv_heads, int head_dim) {
    t.type = type;
    t.n_kv_heads = n_kv_heads;
    t.head_dim = head_dim;
    t.block_size = block_size;
    t.n_blocks = n_blocks;
    bytes.resize(t.bytes());
    t.data = bytes.data();
  }
  float Scale(int64_t slot, int head) const {
    float d;
    std::memcpy(&d, t.scale(slot, head), sizeof d);
    return d;
  }
  // The value the cache holds for element `col` (head-major) of `slot`, dequantized (INT8: the
  // head's scale * q rotated back by an explicit Hadamard matrix, kv_layout.h).
  float At(int64_t slot, int64_t col) const {
    const int head = static_cast<int>(col / t.head_dim);
    const int64_t d = col % t.head_dim;
    const char* p = t.values(slot, head);
    switch (t.type) {
      case KvDType::kF32: return reinterpret_cast<const float*>(p)[d];
      case KvDType::kF16: return F16ToF32(reinterpret_cast<const uint16_t*>(p)[d]);
      case KvDType::kI8: {
        const int b = KvRotationBlock(t.head_dim);
        const int64_t base = d - d % b;
        double sum = 0;
        for (int j = 0; j < b; ++j) {
          sum += testing::HadamardEntry(static_cast<int>(d - base), j) *
                 static_cast<double>(reinterpret_cast<const int8_t*>(p)[base + j]);
        }
        return static_cast<float>(Scale(slot, head) * sum);
      }
    }
    return NAN;
  }
};

// What StoreKv must write for one head of `n` values: the exact INT8 quantization of kv_layout.h
// (x' = RotateKvRowIn(x), scale = max|x'| / 127, q = round half to even of x' * (1 / scale)),
// the quantization written out independently of the kernels.
float ReferenceQuantizeI8(const float* head, int64_t n, int8_t* q) {
  std::vector<float> rotated(head, head + n);
  RotateKvRowIn(rotated.data(), static_cast<int>(n));
  const float* x = rotated.data();
  float amax = 0.f;
  for (int64_t i = 0; i < n; ++i) amax = std::max(amax, std::fabs(x[i]));
  const float d = amax / 127.f;
  const float id = d == 0.f ? 0.f : 1.f / d;
  for (int64_t i = 0; i < n; ++i) q[i] = static_cast<int8_t>(std::nearbyint(x[i] * id));
  return d;
}

TEST_P(CpuBackendTest, StoreKvSlotMapping) {
  for (KvDType ct : {KvDType::kF32, KvDType::kF16, KvDType::kI8}) {
    SCOPED_TRACE(KvDTypeName(ct));
    const int heads = 3, hd = 4, kv_dim = heads * hd, bs = 4, n_blocks = 6;
    HostKv kc(ct, n_blocks, bs, heads, hd), vc(ct, n_blocks, bs, heads, hd);
    // Sequence 0 owns blocks {5, 1}, sequence 1 owns {2, 0, 4}.
    const std::vector<int32_t> t0 = {5, 1}, t1 = {2, 0, 4};
    const std::vector<int32_t> pos = {0, 3, 4, 6, 9};
    const std::vector<int32_t> seq = {0, 0, 0, 1, 1};
    KvBatch kv{pos, seq, {t0, t1}, bs};
    const int64_t n = pos.size();
    std::vector<float> kvals = RandomVec(rng_, n * kv_dim), vvals = RandomVec(rng_, n * kv_dim);
    std::fill(kvals.begin() + 4 * kv_dim + hd, kvals.begin() + 4 * kv_dim + 2 * hd, 0.f);
    HostTensor k = F32(n, kv_dim, kvals), v = F32(n, kv_dim, vvals);
    ASSERT_THAT(be_->StoreKv(k.t, v.t, kc.t, vc.t, kv), IsOk());
    const std::vector<int64_t> want_slot = {5 * 4 + 0, 5 * 4 + 3, 1 * 4 + 0, 0 * 4 + 2, 4 * 4 + 1};
    std::vector<bool> written(n_blocks * bs, false);
    for (int64_t t = 0; t < n; ++t) {
      written[want_slot[t]] = true;
      for (const auto& [vals, cache] : {std::pair{&kvals, &kc}, std::pair{&vvals, &vc}}) {
        for (int h = 0; h < heads; ++h) {
          const float* x = vals->data() + t * kv_dim + h * hd;
          if (ct == KvDType::kI8) {
            int8_t q[hd];
            const float d = ReferenceQuantizeI8(x, hd, q);
            ASSERT_EQ(cache->Scale(want_slot[t], h), d);
            ASSERT_EQ(std::memcmp(cache->t.values(want_slot[t], h), q, hd), 0);
          }
          for (int e = 0; e < hd; ++e) {
            const float want = ct == KvDType::kF16 ? F16ToF32(F32ToF16(x[e])) : x[e];
            // INT8: within half a quantization step per rotated value, and rotating back adds
            // up b of them (|H e|_i <= sum |e_j|).
            const float tol = ct == KvDType::kI8 ? cache->Scale(want_slot[t], h) * 0.5f *
                                                       KvRotationBlock(hd) * 1.0001f
                                                 : 0.f;
            ASSERT_NEAR(cache->At(want_slot[t], h * hd + e), want, tol) << t << " " << h << " " << e;
          }
        }
      }
    }
    // The all-zero head quantizes to scale 0 and zeros.
    ASSERT_EQ(kc.Scale(want_slot[4], 1) == 0.f, ct == KvDType::kI8);
    for (int64_t s = 0; s < n_blocks * bs; ++s) {
      if (written[s]) continue;
      for (int64_t c = 0; c < kv_dim; ++c) ASSERT_EQ(kc.At(s, c), 0.f) << "slot " << s;
    }

    // Errors: position past the block table, unknown sequence, block outside the cache,
    // mismatched span sizes, bad cache type, block size differing from the batch's, wide rows.
    const std::vector<int32_t> far = {0, 3, 4, 6, 12};
    KvBatch bad = kv;
    bad.pos = far;
    EXPECT_THAT(be_->StoreKv(k.t, v.t, kc.t, vc.t, bad),
                StatusIs(absl::StatusCode::kInvalidArgument));
    const std::vector<int32_t> seq2 = {0, 0, 0, 1, 2};
    bad = kv;
    bad.seq = seq2;
    EXPECT_THAT(be_->StoreKv(k.t, v.t, kc.t, vc.t, bad),
                StatusIs(absl::StatusCode::kInvalidArgument));
    const std::vector<int32_t> t_out = {2, 0, 6};
    bad = kv;
    bad.block_tables[1] = t_out;
    EXPECT_THAT(be_->StoreKv(k.t, v.t, kc.t, vc.t, bad),
                StatusIs(absl::StatusCode::kInvalidArgument));
    bad = kv;
    bad.pos = absl::MakeConstSpan(pos).subspan(1);
    EXPECT_THAT(be_->StoreKv(k.t, v.t, kc.t, vc.t, bad),
                StatusIs(absl::StatusCode::kInvalidArgument));
    bad = kv;
    bad.block_size = 2;
    EXPECT_THAT(be_->StoreKv(k.t, v.t, kc.t, vc.t, bad),
                StatusIs(absl::StatusCode::kInvalidArgument));
    HostKv kq(ct, n_blocks, bs, heads, hd);
    kq.t.type = static_cast<KvDType>(7);
    EXPECT_THAT(be_->StoreKv(k.t, v.t, kq.t, vc.t, kv), StatusIs(absl::StatusCode::kUnimplemented));
    HostTensor k_wide(DType::kF32, n, kv_dim + 1);
    EXPECT_THAT(be_->StoreKv(k_wide.t, v.t, kc.t, vc.t, kv),
                StatusIs(absl::StatusCode::kInvalidArgument));
  }
}

// Naive attention over the visible positions of each token, in double, over the values the
// caches hold (dequantized for INT8).
std::vector<double> AttentionReference(const std::vector<float>& q, const HostKv& kc,
                                       const HostKv& vc, const KvBatch& kv,
                                       const AttentionParams& p) {
  const int64_t n = kv.pos.size(), hd = p.head_dim, group = p.n_heads / p.n_kv_heads;
  std::vector<double> out(n * p.n_heads * hd, 0.0);
  for (int64_t t = 0; t < n; ++t) {
    const int64_t lo = p.window > 0 ? std::max<int64_t>(0, kv.pos[t] - p.window + 1) : 0;
    for (int h = 0; h < p.n_heads; ++h) {
      const int kvh = h / group;
      std::vector<double> logits;
      std::vector<int64_t> slots;
      for (int64_t pp = lo; pp <= kv.pos[t]; ++pp) {
        const int64_t slot =
            int64_t{kv.block_tables[kv.seq[t]][pp / kv.block_size]} * kv.block_size +
            pp % kv.block_size;
        double s = 0;
        for (int64_t d = 0; d < hd; ++d)
          s += double{q[(t * p.n_heads + h) * hd + d]} * kc.At(slot, kvh * hd + d);
        s *= p.scale;
        if (p.softcap > 0) s = p.softcap * std::tanh(s / p.softcap);
        logits.push_back(s);
        slots.push_back(slot);
      }
      const double m = *std::max_element(logits.begin(), logits.end());
      double sum = 0;
      for (double& l : logits) sum += l = std::exp(l - m);
      for (size_t j = 0; j < slots.size(); ++j)
        for (int64_t d = 0; d < hd; ++d)
          out[(t * p.n_heads + h) * hd + d] += logits[j] / sum * vc.At(slots[j], kvh * hd + d);
    }
  }
  return out;
}

struct AttentionVariant {
  KvDType cache;
  int head_dim, n_heads, n_kv_heads, window;
  float softcap;
};

// Odd head counts (3 kv heads, groups of 3), GQA and MHA, head_dims that leave SIMD tails.
const std::vector<AttentionVariant>& AttentionVariants() {
  static const std::vector<AttentionVariant> variants = {
      {KvDType::kF32, 16, 4, 2, 0, 0.f}, {KvDType::kF16, 16, 4, 2, 0, 0.f},
      {KvDType::kF32, 20, 6, 2, 3, 0.f}, {KvDType::kF16, 20, 6, 3, 3, 5.f},
      {KvDType::kF32, 64, 8, 1, 0, 2.f}, {KvDType::kF32, 8, 2, 2, 1, 0.f},
      {KvDType::kI8, 16, 4, 2, 0, 0.f},  {KvDType::kI8, 20, 9, 3, 3, 5.f},
      {KvDType::kI8, 64, 8, 1, 0, 2.f},  {KvDType::kI8, 40, 3, 3, 0, 0.f},
      {KvDType::kI8, 8, 2, 2, 1, 0.f},
  };
  return variants;
}

// Runs a two-step workload (a prefill of sequence 1, then a mixed batch) on `be`; returns the
// attention output of the mixed batch and leaves the caches in *kc, *vc.
std::vector<float> RunAttention(Backend& be, const AttentionVariant& var, uint32_t seed,
                                std::unique_ptr<HostKv>* kc, std::unique_ptr<HostKv>* vc,
                                std::vector<float>* qv_out, std::vector<int32_t>* pos_out,
                                std::vector<int32_t>* seq_out) {
  std::mt19937 rng(seed);
  AttentionParams p{var.n_heads,  var.n_kv_heads,
                    var.head_dim, 1.f / std::sqrt(float(var.head_dim)),
                    var.window,   var.softcap};
  const int64_t kv_dim = int64_t{p.n_kv_heads} * p.head_dim;
  const int bs = 4, n_blocks = 8;
  *kc = std::make_unique<HostKv>(var.cache, n_blocks, bs, p.n_kv_heads, p.head_dim);
  *vc = std::make_unique<HostKv>(var.cache, n_blocks, bs, p.n_kv_heads, p.head_dim);
  // Garbage in unwritten slots must not be read (as INT8 scales, 0x7f7f7f7f is 3.4e38).
  std::memset((*kc)->bytes.data(), 0x7f, (*kc)->bytes.size());
  std::memset((*vc)->bytes.data(), 0x7f, (*vc)->bytes.size());
  // Sequence 0: blocks {6, 2}; sequence 1: blocks {1, 7, 3}.
  static const std::vector<int32_t> t0 = {6, 2}, t1 = {1, 7, 3};
  // Step 1: a prefill of sequence 1 positions 0..8 (stored, no attention checked).
  std::vector<int32_t> pre_pos, pre_seq;
  for (int i = 0; i < 9; ++i) pre_pos.push_back(i), pre_seq.push_back(1);
  KvBatch pre{pre_pos, pre_seq, {t0, t1}, bs};
  HostTensor pk = F32(9, kv_dim, RandomVec(rng, 9 * kv_dim, 2.f));
  HostTensor pv = F32(9, kv_dim, RandomVec(rng, 9 * kv_dim));
  EXPECT_THAT(be.StoreKv(pk.t, pv.t, (*kc)->t, (*vc)->t, pre), IsOk());
  // Step 2: a mixed batch: sequence 0 prefills positions 0..5, sequence 1 decodes 9 and 10.
  *pos_out = {0, 1, 2, 9, 3, 4, 10, 5};
  *seq_out = {0, 0, 0, 1, 0, 0, 1, 0};
  KvBatch kv{*pos_out, *seq_out, {t0, t1}, bs};
  const int64_t n = pos_out->size();
  HostTensor k = F32(n, kv_dim, RandomVec(rng, n * kv_dim, 2.f));
  HostTensor v = F32(n, kv_dim, RandomVec(rng, n * kv_dim));
  EXPECT_THAT(be.StoreKv(k.t, v.t, (*kc)->t, (*vc)->t, kv), IsOk());
  *qv_out = RandomVec(rng, n * p.n_heads * p.head_dim, 2.f);
  HostTensor q = F32(n, int64_t{p.n_heads} * p.head_dim, *qv_out);
  HostTensor out(DType::kF32, n, q.t.cols);
  EXPECT_THAT(be.Attention(q.t, (*kc)->t, (*vc)->t, kv, p, out.t), IsOk());
  // out may alias q.
  EXPECT_THAT(be.Attention(q.t, (*kc)->t, (*vc)->t, kv, p, q.t), IsOk());
  EXPECT_EQ(std::memcmp(q.t.data, out.t.data, out.t.bytes()), 0);
  return std::vector<float>(out.f(), out.f() + out.t.numel());
}

TEST_P(CpuBackendTest, AttentionGqaTwoSequencesWindowSoftcap) {
  uint32_t seed = 1;
  for (const AttentionVariant& var : AttentionVariants()) {
    SCOPED_TRACE(::testing::Message() << "cache " << KvDTypeName(var.cache) << " hd "
                                      << var.head_dim << " heads " << var.n_heads << "/"
                                      << var.n_kv_heads << " window " << var.window << " softcap "
                                      << var.softcap);
    std::unique_ptr<HostKv> kc, vc;
    std::vector<float> qv;
    std::vector<int32_t> pos, seq;
    const std::vector<float> out = RunAttention(*be_, var, seed++, &kc, &vc, &qv, &pos, &seq);
    const std::vector<int32_t> t0 = {6, 2}, t1 = {1, 7, 3};
    KvBatch kv{pos, seq, {t0, t1}, 4};
    AttentionParams p{var.n_heads,  var.n_kv_heads,
                      var.head_dim, 1.f / std::sqrt(float(var.head_dim)),
                      var.window,   var.softcap};
    const std::vector<double> ref = AttentionReference(qv, *kc, *vc, kv, p);
    ASSERT_EQ(ref.size(), out.size());
    for (size_t i = 0; i < ref.size(); ++i) ASSERT_NEAR(out[i], ref[i], 2e-5) << "i=" << i;
  }
}

// Prompt rows over an F16 cache take the GEMM order (every row one chain per score and per
// output column, docs/numerics.md), in tiles of up to 32 rows that read each key and value once;
// F32 caches widen F16 rows never, and sum in ggml's order. Either way a row's bits must not
// depend on the rows it runs with: every row of a 70-row prompt, run in one batch with a second
// sequence of 5 rows, equals the same row run on its own (with a copy of itself: a sequence's
// rows sum V in tinyBLAS's order when the batch holds two or more of them), for GQA groups of
// 4 and 1 and 3 (tiles of 8, 32 and 11 rows), head dims 32, 256 and 80 (SIMD column tails), with
// and without sliding windows.
TEST_P(CpuBackendTest, PromptAttentionEqualsRowByRowBitForBit) {
  std::mt19937 rng(21);
  const AttentionParams shapes[] = {{8, 2, 32, 1.f / std::sqrt(32.f), 0, 0.f},
                                    {4, 1, 256, 1.f / 16.f, 0, 0.f},
                                    {3, 3, 80, 1.f / std::sqrt(80.f), 0, 0.f}};
  for (KvDType type : {KvDType::kF16, KvDType::kF32}) {
    for (const AttentionParams& shape : shapes) {
      for (int window : {0, 7, 40}) {
        SCOPED_TRACE(::testing::Message() << KvDTypeName(type) << " hd " << shape.head_dim
                                          << " heads " << shape.n_heads << "/" << shape.n_kv_heads
                                          << " window " << window);
        AttentionParams p = shape;
        p.window = window;
        const int64_t kv_dim = int64_t{p.n_kv_heads} * p.head_dim;
        const int bs = 4, n_blocks = 24;
        HostKv kc(type, n_blocks, bs, p.n_kv_heads, p.head_dim);
        HostKv vc(type, n_blocks, bs, p.n_kv_heads, p.head_dim);
        // Sequence 0: a 70-token prompt (blocks 0..17); sequence 1: 5 rows (blocks 18..19).
        std::vector<int32_t> t0, t1 = {18, 19};
        for (int b = 0; b < 18; ++b) t0.push_back(b);
        std::vector<int32_t> pos, seq;
        for (int i = 0; i < 70; ++i) pos.push_back(i), seq.push_back(0);
        for (int i = 0; i < 5; ++i) pos.push_back(i), seq.push_back(1);
        const int64_t n = static_cast<int64_t>(pos.size());
        KvBatch kv{pos, seq, {t0, t1}, bs};
        HostTensor k = F32(n, kv_dim, RandomVec(rng, n * kv_dim, 2.f));
        HostTensor v = F32(n, kv_dim, RandomVec(rng, n * kv_dim));
        ASSERT_THAT(be_->StoreKv(k.t, v.t, kc.t, vc.t, kv), IsOk());
        const std::vector<float> qv = RandomVec(rng, n * p.n_heads * p.head_dim, 2.f);
        HostTensor q = F32(n, int64_t{p.n_heads} * p.head_dim, qv);
        HostTensor all(DType::kF32, n, q.t.cols);
        ASSERT_THAT(be_->Attention(q.t, kc.t, vc.t, kv, p, all.t), IsOk());
        for (int64_t t = 0; t < n; ++t) {
          std::vector<int32_t> p1 = {pos[t], pos[t]}, s1 = {0, 0};
          KvBatch one{p1, s1, {seq[t] == 0 ? t0 : t1}, bs};
          std::vector<float> row(qv.begin() + t * q.t.cols, qv.begin() + (t + 1) * q.t.cols);
          row.insert(row.end(), row.begin(), row.end());
          HostTensor q1 = F32(2, q.t.cols, row);
          HostTensor o1(DType::kF32, 2, q.t.cols);
          ASSERT_THAT(be_->Attention(q1.t, kc.t, vc.t, one, p, o1.t), IsOk());
          ASSERT_EQ(std::memcmp(o1.f(), all.f() + t * q.t.cols, q.t.cols * sizeof(float)), 0)
              << "row " << t;
        }
      }
    }
  }
}

// The GEMM order changes the order of additions, not what is added: prompt attention over an F16
// cache stays within a bound of the F32 cache's (ggml's order) on the same F16-representable
// values. Each of the hd products of a score and the L weighted terms of an output is summed
// once in F32 in either order, and each order is within (n - 1) * u * sum |terms| of the exact
// sum (u = 2^-24), so the two differ by at most 2 n u sum |terms|. Weighted sums: the weights add
// to 1, sum |terms| <= max |v|: 2 L u max |v|. Scores: sum |terms| <= hd max|q| max|k|, times
// the scale: d = 2 hd^2 u max|q| max|k| scale; a score off by d moves every output by at most
// (e^2d - 1) max |v| ~ 2 d max |v|. Checked: max |f16 - f32| <= 2 L u max|v| + 4 d max|v|, for
// Gemma 3 270M's shape at 300 positions.
TEST(CpuBackendGemmOrderTest, F16PromptAttentionWithinTheSummationBoundOfF32) {
  std::mt19937 rng(13);
  const AttentionParams p{4, 1, 256, 1.f / 16.f, 0, 0.f};
  const int bs = 16, n_pos = 300, n_blocks = 19;
  std::vector<int32_t> table;
  for (int b = 0; b < n_blocks; ++b) table.push_back(n_blocks - 1 - b);
  std::vector<int32_t> pos, seq;
  for (int i = 0; i < n_pos; ++i) pos.push_back(i), seq.push_back(0);
  KvBatch kv{pos, seq, {table}, bs};
  auto f16_exact = [&](int64_t n, float scale) {
    std::vector<float> v = RandomVec(rng, n, scale);
    for (float& x : v) x = F16ToF32(F32ToF16(x));
    return v;
  };
  const std::vector<float> kvals = f16_exact(int64_t{n_pos} * p.head_dim, 2.f);
  const std::vector<float> vvals = f16_exact(int64_t{n_pos} * p.head_dim, 1.f);
  HostTensor k = F32(n_pos, p.head_dim, kvals), v = F32(n_pos, p.head_dim, vvals);
  const int64_t cols = int64_t{p.n_heads} * p.head_dim;
  const std::vector<float> qv = RandomVec(rng, n_pos * cols, 2.f);
  HostTensor q = F32(n_pos, cols, qv);
  auto be = CreateCpuBackend({.threads = 2});
  std::vector<std::vector<float>> outs;
  for (KvDType dt : {KvDType::kF32, KvDType::kF16}) {
    HostKv kc(dt, n_blocks, bs, p.n_kv_heads, p.head_dim);
    HostKv vc(dt, n_blocks, bs, p.n_kv_heads, p.head_dim);
    ASSERT_THAT(be->StoreKv(k.t, v.t, kc.t, vc.t, kv), IsOk());
    HostTensor o(DType::kF32, n_pos, cols);
    ASSERT_THAT(be->Attention(q.t, kc.t, vc.t, kv, p, o.t), IsOk());
    outs.emplace_back(o.f(), o.f() + o.t.numel());
  }
  auto amax = [](const std::vector<float>& x) {
    float m = 0.f;
    for (float e : x) m = std::max(m, std::fabs(e));
    return m;
  };
  const double u = std::ldexp(1.0, -24);
  const double qk = double{amax(qv)} * amax(kvals), vmax = amax(vvals);
  const double d = 2.0 * p.head_dim * p.head_dim * u * qk * p.scale;
  const double bound = 2.0 * n_pos * u * vmax + 4.0 * d * vmax;
  double worst = 0;
  size_t differ = 0;
  for (size_t i = 0; i < outs[0].size(); ++i) {
    const double e = std::fabs(double{outs[0][i]} - outs[1][i]);
    worst = std::max(worst, e);
    differ += e != 0;
  }
  EXPECT_LE(worst, bound);
  // The orders do differ (the test would not notice a silent fall back to ggml's order).
  EXPECT_GT(differ, outs[0].size() / 10);
}

// Decode of one sequence has fewer (row, KV head) items than threads (one KV head, as in Gemma 3
// 270M): the group's query heads are split across the threads. Every head must come out the
// same whichever thread computes it, for each cache type; and an F16 cache holding the same
// (F16-representable) values must stay within the summation bound of the F32 cache's result.
TEST(CpuBackendDecodeTest, SplitHeadsGiveTheBitsOfOneThread) {
  std::mt19937 rng(5);
  AttentionParams p{4, 1, 64, 1.f / 8.f, 0, 0.f};
  const int bs = 4, n_blocks = 40, n_pos = 150;
  std::vector<int32_t> table;
  for (int b = 0; b < n_blocks; ++b) table.push_back(b);
  std::vector<int32_t> pos, seq;
  for (int i = 0; i < n_pos; ++i) pos.push_back(i), seq.push_back(0);
  KvBatch store{pos, seq, {table}, bs};
  // K/V rounded to F16 first, so that the F16 and F32 caches hold the same numbers.
  auto f16_exact = [&](int64_t n) {
    std::vector<float> v = RandomVec(rng, n, 2.f);
    for (float& x : v) x = F16ToF32(F32ToF16(x));
    return v;
  };
  HostTensor k = F32(n_pos, p.head_dim, f16_exact(int64_t{n_pos} * p.head_dim));
  HostTensor v = F32(n_pos, p.head_dim, f16_exact(int64_t{n_pos} * p.head_dim));
  HostTensor q = F32(1, int64_t{p.n_heads} * p.head_dim,
                     RandomVec(rng, int64_t{p.n_heads} * p.head_dim, 2.f));
  std::vector<int32_t> p1 = {n_pos - 1}, s1 = {0};
  KvBatch one{p1, s1, {table}, bs};
  std::vector<float> f32_out;
  for (KvDType dt : {KvDType::kF32, KvDType::kF16, KvDType::kI8}) {
    SCOPED_TRACE(KvDTypeName(dt));
    std::vector<std::vector<float>> outs;
    for (int threads : {1, 2, 3, 4}) {
      auto be = CreateCpuBackend({.threads = threads});
      HostKv kc(dt, n_blocks, bs, p.n_kv_heads, p.head_dim);
      HostKv vc(dt, n_blocks, bs, p.n_kv_heads, p.head_dim);
      ASSERT_THAT(be->StoreKv(k.t, v.t, kc.t, vc.t, store), IsOk());
      HostTensor o(DType::kF32, 1, q.t.cols);
      ASSERT_THAT(be->Attention(q.t, kc.t, vc.t, one, p, o.t), IsOk());
      outs.emplace_back(o.f(), o.f() + q.t.cols);
    }
    for (size_t i = 1; i < outs.size(); ++i) {
      ASSERT_EQ(std::memcmp(outs[0].data(), outs[i].data(), outs[0].size() * sizeof(float)), 0)
          << "threads " << i + 1;
    }
    if (dt == KvDType::kF32) f32_out = outs[0];
    if (dt == KvDType::kF16) {
      // The same scores (ggml's dots on the same numbers); the V sums differ in order only: F32
      // in ggml's 4L accumulators and tree, F16 in one chain per column. Each is within
      // n u sum_j p_j |v_j| <= n u max|v| of the exact sum (the p_j sum to 1).
      float v_max = 0.f;
      for (int64_t i = 0; i < v.t.rows * v.t.cols; ++i)
        v_max = std::max(v_max, std::fabs(v.f()[i]));
      const double bound = 2.0 * n_pos * std::ldexp(1.0, -24) * v_max;
      for (size_t i = 0; i < f32_out.size(); ++i) {
        ASSERT_NEAR(outs[0][i], f32_out[i], bound) << i;
      }
    }
  }
}

// Gemma 3 270M's attention shape (4 query heads per KV head of 256) on 16-slot blocks in shuffled
// order: a 40-row prompt of sequence 0 (F16: widened once per sequence), a decode row of sequence
// 1 at position 150 with a sliding window of 100 or none, and the same decode row alone (one row:
// ggml_vec_dot_f32's 4L accumulators). Returns both outputs, concatenated.
std::vector<float> RunGemmaShapedAttention(Backend& be, KvDType type, int window) {
  std::mt19937 rng(77);
  const AttentionParams p{4, 1, 256, 1.f / 16.f, window, 0.f};
  const int bs = 16, n_blocks = 16;
  HostKv kc(type, n_blocks, bs, p.n_kv_heads, p.head_dim);
  HostKv vc(type, n_blocks, bs, p.n_kv_heads, p.head_dim);
  const std::vector<int32_t> t0 = {9, 2, 14}, t1 = {3, 11, 0, 7, 5, 13, 1, 8, 10, 12};
  std::vector<int32_t> pos, seq;
  for (int i = 0; i < 151; ++i) pos.push_back(i), seq.push_back(1);
  for (int i = 0; i < 40; ++i) pos.push_back(i), seq.push_back(0);
  const int64_t n = static_cast<int64_t>(pos.size());
  KvBatch store{pos, seq, {t0, t1}, bs, {}};
  HostTensor k = F32(n, p.head_dim, RandomVec(rng, n * p.head_dim, 2.f));
  HostTensor v = F32(n, p.head_dim, RandomVec(rng, n * p.head_dim));
  EXPECT_THAT(be.StoreKv(k.t, v.t, kc.t, vc.t, store), IsOk());
  const int64_t cols = int64_t{p.n_heads} * p.head_dim;
  // Batch: the prompt rows of sequence 0 and the decode row of sequence 1.
  std::vector<int32_t> bpos(pos.begin() + 151, pos.end()), bseq(40, 0);
  bpos.push_back(150), bseq.push_back(1);
  KvBatch kv{bpos, bseq, {t0, t1}, bs, {}};
  HostTensor q = F32(41, cols, RandomVec(rng, 41 * cols, 2.f));
  HostTensor out(DType::kF32, 41, cols);
  EXPECT_THAT(be.Attention(q.t, kc.t, vc.t, kv, p, out.t), IsOk());
  std::vector<float> result(out.f(), out.f() + out.t.numel());
  std::vector<int32_t> p1 = {150}, s1 = {1};
  KvBatch one{p1, s1, {t0, t1}, bs, {}};
  HostTensor q1 = F32(1, cols, std::vector<float>(q.f() + 40 * cols, q.f() + 41 * cols));
  HostTensor o1(DType::kF32, 1, cols);
  EXPECT_THAT(be.Attention(q1.t, kc.t, vc.t, one, p, o1.t), IsOk());
  result.insert(result.end(), o1.f(), o1.f() + cols);
  return result;
}

const cpu::AttnKernels& Avx2AttnOnly() { return cpu::Avx2AttnKernels(); }
const cpu::AttnKernels& Avx512Attn() { return *cpu::Avx512AttnKernels(); }
const cpu::AttnKernels& ScalarAttn16() { return cpu::ScalarAttnKernels(16); }

// Attention's work loop over each SIMD attention table against the scalar twins of the same
// order, bit for bit (F32 and F16 caches; INT8 ones keep the per-pair path): the AVX2 table (what
// CPUs without AVX-512 run, forced here) against the scalar backend's 8-lane order, and the
// AVX-512 table against the scalar 16-lane one; 1 and 3 threads (heads split across threads).
TEST(CpuBackendAttnOrderTest, SimdAttentionMatchesItsScalarTwinBitForBit) {
  const cpu::Kernels* avx2 = cpu::Avx2Kernels();
  if (avx2 == nullptr || &cpu::SelectKernels(false) != avx2) {
    GTEST_SKIP() << "AVX2 kernels not available on this build/CPU";
  }
  static cpu::Kernels avx2_attn = *avx2, avx512_attn = *avx2, scalar8 = cpu::ScalarKernels(),
                      scalar16 = cpu::ScalarKernels();
  avx2_attn.attn = &Avx2AttnOnly;
  avx512_attn.attn = &Avx512Attn;
  scalar16.attn = &ScalarAttn16;
  std::vector<std::pair<const cpu::Kernels*, const cpu::Kernels*>> pairs = {{&avx2_attn, &scalar8}};
  if (cpu::Avx512AttnKernels() != nullptr) pairs.emplace_back(&avx512_attn, &scalar16);
  for (auto [simd, scalar] : pairs) {
    for (int threads : {1, 3}) {
      cpu::CpuBackend a(*simd, threads), b(*scalar, threads);
      SCOPED_TRACE(::testing::Message() << "lanes " << simd->attn().lanes << " threads "
                                        << threads);
      uint32_t seed = 300;
      for (const AttentionVariant& var : AttentionVariants()) {
        if (var.cache == KvDType::kI8) continue;
        SCOPED_TRACE(::testing::Message() << "cache " << KvDTypeName(var.cache) << " hd "
                                          << var.head_dim << " heads " << var.n_heads << "/"
                                          << var.n_kv_heads);
        std::unique_ptr<HostKv> kc, vc;
        std::vector<float> qv;
        std::vector<int32_t> pos, seq;
        const std::vector<float> x = RunAttention(a, var, seed, &kc, &vc, &qv, &pos, &seq);
        const std::vector<float> y = RunAttention(b, var, seed, &kc, &vc, &qv, &pos, &seq);
        ++seed;
        ASSERT_EQ(x.size(), y.size());
        ASSERT_EQ(std::memcmp(x.data(), y.data(), x.size() * sizeof(float)), 0);
      }
      for (KvDType type : {KvDType::kF32, KvDType::kF16}) {
        for (int window : {0, 100}) {
          SCOPED_TRACE(::testing::Message() << "gemma shape " << KvDTypeName(type) << " window "
                                            << window);
          const std::vector<float> x = RunGemmaShapedAttention(a, type, window);
          const std::vector<float> y = RunGemmaShapedAttention(b, type, window);
          ASSERT_EQ(x.size(), y.size());
          ASSERT_EQ(std::memcmp(x.data(), y.data(), x.size() * sizeof(float)), 0);
        }
      }
    }
  }
}

// A batch of prompt rows of several sequences (chunked prefill: each chunk after a stored
// prefix), rows shuffled out of position order, plus a decode row, against each row alone in a
// batch of one (flagged kRowOrderAttnWide where its sequence has several rows, as the batch
// flags it): Attention's tiles of prompt rows give every row the bits of the row-by-row path.
// Every kernel table (SIMD, forced AVX2, scalar twins), 1 and 3 threads, F32 / F16 / INT8
// caches, sliding windows and softcapping, odd head dims.
TEST(CpuBackendAttnOrderTest, PromptRowTilesMatchRowByRowBitForBit) {
  std::vector<std::pair<std::string, const cpu::Kernels*>> tables = {
      {"selected", &cpu::SelectKernels(false)}, {"scalar", &cpu::ScalarKernels()}};
  static cpu::Kernels avx2_attn, avx512_attn, scalar16 = cpu::ScalarKernels();
  scalar16.attn = &ScalarAttn16;
  tables.emplace_back("scalar16", &scalar16);
  if (const cpu::Kernels* avx2 = cpu::Avx2Kernels();
      avx2 != nullptr && &cpu::SelectKernels(false) == avx2) {
    avx2_attn = *avx2, avx512_attn = *avx2;
    avx2_attn.attn = &Avx2AttnOnly;
    avx512_attn.attn = &Avx512Attn;
    tables.emplace_back("avx2", &avx2_attn);
    if (cpu::Avx512AttnKernels() != nullptr) tables.emplace_back("avx512", &avx512_attn);
  }
  const std::vector<AttentionParams> shapes = {{4, 1, 256, 1.f / 16.f, 0, 0.f},
                                               {4, 1, 256, 1.f / 16.f, 37, 0.f},
                                               {6, 2, 40, 0.2f, 0, 0.f},
                                               {6, 3, 20, 0.3f, 5, 5.f}};
  for (const auto& [name, table] : tables) {
    for (int threads : {1, 3}) {
      cpu::CpuBackend be(*table, threads);
      for (KvDType type : {KvDType::kF32, KvDType::kF16, KvDType::kI8}) {
        for (const AttentionParams& p : shapes) {
          SCOPED_TRACE(::testing::Message()
                       << name << " threads " << threads << " cache " << KvDTypeName(type) << " hd "
                       << p.head_dim << " heads " << p.n_heads << "/" << p.n_kv_heads << " window "
                       << p.window);
          std::mt19937 rng(static_cast<uint32_t>(p.head_dim * 7 + p.window + threads));
          const int bs = 16, n_blocks = 16;
          HostKv kc(type, n_blocks, bs, p.n_kv_heads, p.head_dim);
          HostKv vc(type, n_blocks, bs, p.n_kv_heads, p.head_dim);
          // Sequences of 90, 130 and 3 positions over shuffled blocks.
          std::vector<int32_t> blocks(n_blocks);
          for (int i = 0; i < n_blocks; ++i) blocks[i] = i;
          std::shuffle(blocks.begin(), blocks.end(), rng);
          const std::vector<int32_t> t0(blocks.begin(), blocks.begin() + 6),
              t1(blocks.begin() + 6, blocks.begin() + 15), t2(blocks.begin() + 15, blocks.end());
          const std::vector<absl::Span<const int32_t>> tables_of = {t0, t1, t2};
          std::vector<int32_t> pos, seq;
          for (auto [s, len] : {std::pair{0, 90}, {1, 130}, {2, 3}}) {
            for (int i = 0; i < len; ++i) pos.push_back(i), seq.push_back(s);
          }
          const int64_t n = static_cast<int64_t>(pos.size());
          const int64_t kv_cols = int64_t{p.n_kv_heads} * p.head_dim;
          KvBatch store{pos, seq, tables_of, bs, {}};
          HostTensor k = F32(n, kv_cols, RandomVec(rng, n * kv_cols, 2.f));
          HostTensor v = F32(n, kv_cols, RandomVec(rng, n * kv_cols));
          ASSERT_THAT(be.StoreKv(k.t, v.t, kc.t, vc.t, store), IsOk());
          // The batch: positions 50..89 of sequence 0, 61..129 of sequence 1 and the decode
          // row 2 of sequence 2, shuffled.
          std::vector<std::pair<int32_t, int32_t>> rows;  // (seq, pos)
          for (int i = 50; i < 90; ++i) rows.emplace_back(0, i);
          for (int i = 61; i < 130; ++i) rows.emplace_back(1, i);
          rows.emplace_back(2, 2);
          std::shuffle(rows.begin(), rows.end(), rng);
          std::vector<int32_t> bpos, bseq;
          for (auto [s, ps] : rows) bseq.push_back(s), bpos.push_back(ps);
          const int64_t m = static_cast<int64_t>(rows.size());
          const int64_t cols = int64_t{p.n_heads} * p.head_dim;
          HostTensor q = F32(m, cols, RandomVec(rng, m * cols, 2.f));
          HostTensor out(DType::kF32, m, cols);
          KvBatch kv{bpos, bseq, tables_of, bs, {}};
          ASSERT_THAT(be.Attention(q.t, kc.t, vc.t, kv, p, out.t), IsOk());
          for (int64_t t = 0; t < m; ++t) {
            std::vector<int32_t> p1 = {bpos[t]}, s1 = {bseq[t]};
            const std::vector<uint8_t> order = {bseq[t] == 2 ? uint8_t{0} : kRowOrderAttnWide};
            KvBatch one{p1, s1, tables_of, bs, order};
            HostTensor q1 =
                F32(1, cols, std::vector<float>(q.f() + t * cols, q.f() + (t + 1) * cols));
            HostTensor o1(DType::kF32, 1, cols);
            ASSERT_THAT(be.Attention(q1.t, kc.t, vc.t, one, p, o1.t), IsOk());
            ASSERT_EQ(std::memcmp(o1.f(), out.f() + t * cols, cols * sizeof(float)), 0)
                << "row " << t << " seq " << bseq[t] << " pos " << bpos[t];
          }
        }
      }
    }
  }
}

// The AVX2 and the scalar kernel tables on the same INT8 workload: the stored caches are
// bit-identical (quantization is exact in both) and the outputs agree to F32 rounding.
TEST(CpuBackendInt8Test, SimdMatchesScalarOnInt8Kv) {
  auto best = CreateCpuBackend({.threads = 2});
  auto scalar = CreateCpuBackend({.threads = 2, .force_scalar = true});
  int checked = 0;
  uint32_t seed = 100;
  for (const AttentionVariant& var : AttentionVariants()) {
    if (var.cache != KvDType::kI8) continue;
    SCOPED_TRACE(::testing::Message() << "hd " << var.head_dim << " heads " << var.n_heads << "/"
                                      << var.n_kv_heads);
    std::unique_ptr<HostKv> kc_a, vc_a, kc_b, vc_b;
    std::vector<float> qv;
    std::vector<int32_t> pos, seq;
    const std::vector<float> a = RunAttention(*best, var, seed, &kc_a, &vc_a, &qv, &pos, &seq);
    const std::vector<float> b = RunAttention(*scalar, var, seed, &kc_b, &vc_b, &qv, &pos, &seq);
    ++seed;
    ASSERT_EQ(kc_a->bytes, kc_b->bytes);
    ASSERT_EQ(vc_a->bytes, vc_b->bytes);
    ASSERT_EQ(a.size(), b.size());
    double max_abs = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      ASSERT_NEAR(a[i], b[i], 1e-5) << "i=" << i;
      max_abs = std::max<double>(max_abs, std::fabs(a[i]));
    }
    EXPECT_GT(max_abs, 0.1);  // not trivially zero
    ++checked;
  }
  EXPECT_EQ(checked, 5);
}

// INT8 attention against F32 attention on the same K/V: the quantization error of the cache,
// not a broken dequantization, is the only difference. Bounds from the step size: keys/values
// ~N(0, s) over head_dim 64 have max|x| ~ 2.5 s, so each element is off by <= 2.5 s / 254
// (~1%), and the outputs (convex sums of V) move by about that.
TEST(CpuBackendInt8Test, Int8AttentionCloseToF32) {
  auto be = CreateCpuBackend({.threads = 2});
  for (int hd : {64, 256}) {
    SCOPED_TRACE(hd);
    AttentionVariant f32{KvDType::kF32, hd, 8, 2, 0, 0.f};
    AttentionVariant i8 = f32;
    i8.cache = KvDType::kI8;
    std::unique_ptr<HostKv> kc, vc;
    std::vector<float> qv;
    std::vector<int32_t> pos, seq;
    const std::vector<float> a = RunAttention(*be, f32, 7, &kc, &vc, &qv, &pos, &seq);
    const std::vector<float> b = RunAttention(*be, i8, 7, &kc, &vc, &qv, &pos, &seq);
    double num = 0, den = 0, max_err = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      num += double(a[i] - b[i]) * (a[i] - b[i]);
      den += double(a[i]) * a[i];
      max_err = std::max<double>(max_err, std::fabs(a[i] - b[i]));
    }
    const double rel = std::sqrt(num / den);
    EXPECT_GT(rel, 1e-5) << "int8 cache gives f32 results: not quantized?";
    EXPECT_LT(rel, 0.03);
    // Uniform random K/V are the rotation's worst case (kv_rotation.h): rotated, a flat row
    // becomes a Gaussian one whose max is ~1.7x larger relative to its spread, so the steps are
    // coarser than without it (real K/V, heavy-tailed, gain; kv_rotation_test shows it).
    EXPECT_LT(max_err, 0.2) << "rel " << rel;
  }
}

TEST_P(CpuBackendTest, AttentionWindowAndSoftcapChangeResults) {
  // The same inputs with and without window/softcap must differ (the options are not ignored).
  AttentionParams p{2, 1, 8, 1.f, 0, 0.f};
  const int bs = 4;
  HostKv kc(KvDType::kF32, 2, bs, 1, 8), vc(KvDType::kF32, 2, bs, 1, 8);
  const std::vector<int32_t> table = {0, 1};
  std::vector<int32_t> pos(6), seq(6, 0);
  for (int i = 0; i < 6; ++i) pos[i] = i;
  KvBatch kv{pos, seq, {table}, bs};
  HostTensor k = F32(6, 8, RandomVec(rng_, 48, 3.f)), v = F32(6, 8, RandomVec(rng_, 48));
  ASSERT_THAT(be_->StoreKv(k.t, v.t, kc.t, vc.t, kv), IsOk());
  HostTensor q = F32(6, 16, RandomVec(rng_, 96, 3.f));
  HostTensor base(DType::kF32, 6, 16), windowed(DType::kF32, 6, 16), capped(DType::kF32, 6, 16);
  ASSERT_THAT(be_->Attention(q.t, kc.t, vc.t, kv, p, base.t), IsOk());
  p.window = 2;
  ASSERT_THAT(be_->Attention(q.t, kc.t, vc.t, kv, p, windowed.t), IsOk());
  p.window = 0;
  p.softcap = 1.f;
  ASSERT_THAT(be_->Attention(q.t, kc.t, vc.t, kv, p, capped.t), IsOk());
  // Token 0 and 1 see the same positions with window 2; token 5 does not.
  for (int c = 0; c < 16; ++c) EXPECT_EQ(base.f()[c], windowed.f()[c]);
  bool differs = false, cap_differs = false;
  for (int c = 0; c < 16; ++c) differs |= base.f()[5 * 16 + c] != windowed.f()[5 * 16 + c];
  for (int c = 16; c < 96; ++c) cap_differs |= base.f()[c] != capped.f()[c];
  EXPECT_TRUE(differs);
  EXPECT_TRUE(cap_differs);
  // Window 1: each token sees only itself, so out = its own V row.
  p.softcap = 0.f;
  p.window = 1;
  ASSERT_THAT(be_->Attention(q.t, kc.t, vc.t, kv, p, windowed.t), IsOk());
  for (int t = 0; t < 6; ++t)
    for (int h = 0; h < 2; ++h)
      for (int d = 0; d < 8; ++d)
        EXPECT_NEAR(windowed.f()[t * 16 + h * 8 + d], v.f()[t * 8 + d], 1e-6);
}

TEST_P(CpuBackendTest, AttentionValidation) {
  AttentionParams p{4, 2, 8, 0.3f, 0, 0.f};
  HostKv kc(KvDType::kF32, 2, 4, 2, 8), vc(KvDType::kF32, 2, 4, 2, 8);
  HostTensor q(DType::kF32, 1, 32), out(DType::kF32, 1, 32);
  const std::vector<int32_t> table = {0, 1}, pos = {5}, seq = {0};
  KvBatch kv{pos, seq, {table}, 4};
  EXPECT_THAT(be_->Attention(q.t, kc.t, vc.t, kv, p, out.t), IsOk());
  AttentionParams bad = p;
  bad.n_kv_heads = 3;
  EXPECT_THAT(be_->Attention(q.t, kc.t, vc.t, kv, bad, out.t),
              StatusIs(absl::StatusCode::kInvalidArgument));
  bad = p;
  bad.head_dim = 4;
  EXPECT_THAT(be_->Attention(q.t, kc.t, vc.t, kv, bad, out.t),
              StatusIs(absl::StatusCode::kInvalidArgument));
  const std::vector<int32_t> far = {8};  // needs a third block
  KvBatch kv_far{far, seq, {table}, 4};
  EXPECT_THAT(be_->Attention(q.t, kc.t, vc.t, kv_far, p, out.t),
              StatusIs(absl::StatusCode::kInvalidArgument));
  const std::vector<int32_t> table_out = {0, 2};  // block 2 is past the 2-block cache
  KvBatch kv_out{pos, seq, {table_out}, 4};
  EXPECT_THAT(be_->Attention(q.t, kc.t, vc.t, kv_out, p, out.t),
              StatusIs(absl::StatusCode::kInvalidArgument));
  KvBatch kv_bs = kv;
  kv_bs.block_size = 8;
  EXPECT_THAT(be_->Attention(q.t, kc.t, vc.t, kv_bs, p, out.t),
              StatusIs(absl::StatusCode::kInvalidArgument));
  HostKv kb(KvDType::kF32, 2, 4, 2, 8);
  kb.t.type = static_cast<KvDType>(9);
  EXPECT_THAT(be_->Attention(q.t, kb.t, vc.t, kv, p, out.t),
              StatusIs(absl::StatusCode::kUnimplemented));
  HostKv k8(KvDType::kI8, 2, 4, 1, 16);  // same bytes per row, other head shape
  EXPECT_THAT(be_->Attention(q.t, k8.t, vc.t, kv, p, out.t),
              StatusIs(absl::StatusCode::kInvalidArgument));
  HostTensor out_bad(DType::kF32, 2, 32);
  EXPECT_THAT(be_->Attention(q.t, kc.t, vc.t, kv, p, out_bad.t),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

// ---- memory --------------------------------------------------------------------------------

TEST_P(CpuBackendTest, MemoryOps) {
  auto buf = be_->Allocate(1000);
  ASSERT_THAT(buf, IsOk());
  EXPECT_EQ((*buf)->size(), 1000u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>((*buf)->data()) % 64, 0u);
  std::vector<char> src(1000), dst(1000, 0);
  for (int i = 0; i < 1000; ++i) src[i] = static_cast<char>(i * 7);
  ASSERT_THAT(be_->Upload((*buf)->data(), src.data(), 1000), IsOk());
  ASSERT_THAT(be_->Download(dst.data(), (*buf)->data(), 1000), IsOk());
  EXPECT_EQ(src, dst);
  ASSERT_THAT(be_->Zero(static_cast<char*>((*buf)->data()) + 10, 20), IsOk());
  ASSERT_THAT(be_->Download(dst.data(), (*buf)->data(), 1000), IsOk());
  for (int i = 0; i < 1000; ++i) EXPECT_EQ(dst[i], (i >= 10 && i < 30) ? 0 : src[i]) << i;
  EXPECT_THAT(be_->Upload(nullptr, src.data(), 4), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(be_->Allocate(0), IsOk());
  EXPECT_THAT(be_->Allocate(size_t{1} << 62), StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_THAT(be_->Allocate(~size_t{0}), StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_THAT(be_->Synchronize(), IsOk());
}

// By default MapWeights copies each tensor into the backend's own (2 MiB-page) memory, laid end
// to end and 64-byte aligned, and hands the copy's ownership to *storage; the copies stay valid
// while any of them lives.
TEST_P(CpuBackendTest, MapWeightsCopiesIntoItsOwnMemory) {
  HostTensor w(DType::kQ8_0, 3, 64);
  std::memset(w.t.data, 0x5A, w.t.bytes());
  std::unique_ptr<Buffer> buf;
  auto mapped = be_->MapWeights(w.t, &buf);
  ASSERT_THAT(mapped, IsOk());
  ASSERT_NE(buf, nullptr);
  EXPECT_NE(mapped->data, w.t.data);
  EXPECT_EQ(mapped->data, buf->data());
  EXPECT_EQ(buf->size(), w.t.bytes());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(mapped->data) % 64, 0u);
  EXPECT_EQ(std::memcmp(mapped->data, w.t.data, w.t.bytes()), 0);
  EXPECT_EQ(mapped->type, DType::kQ8_0);
  EXPECT_EQ(mapped->rows, 3);
  EXPECT_EQ(mapped->cols, 64);
  // A second tensor lands after the first; dropping the first leaves it intact.
  HostTensor w2(DType::kQ8_0, 5, 96);
  std::memset(w2.t.data, 0x33, w2.t.bytes());
  std::unique_ptr<Buffer> buf2;
  auto mapped2 = be_->MapWeights(w2.t, &buf2);
  ASSERT_THAT(mapped2, IsOk());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(mapped2->data) % 64, 0u);
  EXPECT_GE(static_cast<const char*>(mapped2->data),
            static_cast<const char*>(mapped->data) + w.t.bytes());
  buf.reset();
  EXPECT_EQ(std::memcmp(mapped2->data, w2.t.data, w2.t.bytes()), 0);
  // A copy computes what the original does.
  HostTensor x(DType::kF32, 2, 96), y1(DType::kF32, 2, 5), y2(DType::kF32, 2, 5);
  for (int64_t i = 0; i < 2 * 96; ++i) static_cast<float*>(x.t.data)[i] = 0.01f * (i % 17);
  ASSERT_THAT(be_->MatMul(w2.t, x.t, y1.t), IsOk());
  ASSERT_THAT(be_->MatMul(*mapped2, x.t, y2.t), IsOk());
  EXPECT_EQ(std::memcmp(y1.t.data, y2.t.data, y1.t.bytes()), 0);
}

TEST_P(CpuBackendTest, MapWeightsChecksTheTensor) {
  HostTensor w(DType::kQ8_0, 3, 64);
  std::unique_ptr<Buffer> buf;
  Tensor q4k = w.t;
  q4k.type = DType::kQ4_K;  // every matmul weight type maps
  q4k.cols = 256;
  q4k.rows = 1;
  EXPECT_THAT(be_->MapWeights(q4k, &buf), IsOk());
  Tensor bad = w.t;
  bad.type = DType::kQ8_K;  // activations only
  bad.cols = 256;
  EXPECT_THAT(be_->MapWeights(bad, &buf), StatusIs(absl::StatusCode::kUnimplemented));
  bad = w.t;
  bad.cols = 40;
  EXPECT_THAT(be_->MapWeights(bad, &buf), StatusIs(absl::StatusCode::kInvalidArgument));
}

// With copy_weights off (PDSERVE_CPU_WEIGHTS=mmap) the tensor is a view of the host bytes and
// *storage is left empty.
TEST(CpuBackendWeightsTest, MapWeightsIsAViewWithoutCopies) {
  auto be = CreateCpuBackend({.threads = 1, .copy_weights = false});
  HostTensor w(DType::kQ8_0, 3, 64);
  std::unique_ptr<Buffer> buf = *be->Allocate(16);  // MapWeights must leave it empty
  auto mapped = be->MapWeights(w.t, &buf);
  ASSERT_THAT(mapped, IsOk());
  EXPECT_EQ(mapped->data, w.t.data);
  EXPECT_EQ(buf, nullptr);
}

// Copies stop at copy_weights_max_bytes (by default half of MemAvailable): the tensors after stay
// views of the host bytes, so a model near the machine's memory is paged from its file instead
// of exhausting memory. Each copy counts its 64-byte-aligned size.
TEST(CpuBackendWeightsTest, CopiesStopAtTheirBudget) {
  auto be = CreateCpuBackend({.threads = 1, .copy_weights_max_bytes = 2 * 3 * 34 + 100});
  HostTensor a(DType::kQ8_0, 3, 64), b(DType::kQ8_0, 3, 64), c(DType::kQ8_0, 3, 64);
  std::unique_ptr<Buffer> ba, bb, bc;
  auto ma = be->MapWeights(a.t, &ba);  // 204 bytes -> 256 of 304
  auto mb = be->MapWeights(b.t, &bb);  // 256 more would pass the budget: a view
  ASSERT_THAT(ma, IsOk());
  ASSERT_THAT(mb, IsOk());
  EXPECT_NE(ba, nullptr);
  EXPECT_NE(ma->data, a.t.data);
  EXPECT_EQ(bb, nullptr);
  EXPECT_EQ(mb->data, b.t.data);
  auto mc = be->MapWeights(c.t, &bc);  // and so on
  ASSERT_THAT(mc, IsOk());
  EXPECT_EQ(mc->data, c.t.data);
}

// An environment variable set by a test and put back as it was when the test ends (also when an
// ASSERT returns early).
class ScopedEnv {
 public:
  explicit ScopedEnv(const char* name) : name_(name) {
    const char* old = std::getenv(name);
    had_ = old != nullptr;
    if (had_) saved_ = old;
  }
  ~ScopedEnv() {
    if (had_) {
      ::setenv(name_, saved_.c_str(), 1);
    } else {
      ::unsetenv(name_);
    }
  }
  void Set(const char* value) { ::setenv(name_, value, 1); }
  void Unset() { ::unsetenv(name_); }

 private:
  const char* name_;
  bool had_ = false;
  std::string saved_;
};

TEST(CpuBackendWeightsTest, EnvironmentPicksCopyOrMmap) {
  ScopedEnv env("PDSERVE_CPU_WEIGHTS");
  env.Unset();
  EXPECT_EQ(CpuCopyWeightsFromEnv().value_or(false), true);
  env.Set("copy");
  EXPECT_EQ(CpuCopyWeightsFromEnv().value_or(false), true);
  env.Set("mmap");
  absl::StatusOr<bool> mmap = CpuCopyWeightsFromEnv();
  ASSERT_THAT(mmap, IsOk());
  EXPECT_FALSE(*mmap);
  env.Set("huge");
  EXPECT_THAT(CpuCopyWeightsFromEnv(),
              StatusIs(absl::StatusCode::kInvalidArgument, "PDSERVE_CPU_WEIGHTS='huge'"));
}

TEST(CpuBackendAttnOrderTest, EnvironmentPicksTheOrderOrRefuses) {
  ScopedEnv env("PDSERVE_ATTN_ORDER");
  auto read = [] {
    absl::StatusOr<bool> ggml = CpuAttnGgmlOrderFromEnv();
    EXPECT_THAT(ggml, IsOk());
    return ggml.value_or(false);
  };
  env.Unset();
  EXPECT_FALSE(read());
  env.Set("");
  EXPECT_FALSE(read());
  env.Set("ggml");
  EXPECT_TRUE(read());
  env.Set("gemm");
  EXPECT_THAT(CpuAttnGgmlOrderFromEnv(),
              StatusIs(absl::StatusCode::kInvalidArgument, "PDSERVE_ATTN_ORDER='gemm'"));
}

TEST(CpuBackendNameTest, Name) { EXPECT_EQ(CreateCpuBackend()->name(), "cpu"); }

// ---- TopK ------------------------------------------------------------------------------------

// Rows of logits with ties, both zeros, -inf and a NaN, in shapes that take each path: rows in
// parallel, and one row cut into per-thread chunks then merged. Every thread count must give
// RowTopK's entries (the documented order, tested against a full sort in sampler_test) exactly.
TEST(CpuBackendTopKTest, EveryPathGivesTheRowsBestInRankOrder) {
  std::mt19937 rng(11);
  std::uniform_int_distribution<int> grid(-400, 400);
  for (const int threads : {1, 2, 3, 4}) {
    std::unique_ptr<Backend> be = CreateCpuBackend({.threads = threads});
    for (const auto& [rows, cols] : std::vector<std::pair<int, int>>{
             {1, 7}, {1, 262144}, {2, 70000}, {5, 32000}, {1, 16384 * 4 + 3}}) {
      std::vector<float> x(static_cast<size_t>(rows) * cols);
      for (float& v : x) v = grid(rng) / 16.f;  // ~800 distinct values: many ties
      x[3 % x.size()] = NAN;
      x[1 % x.size()] = -0.f;
      x[x.size() / 2] = INFINITY;
      x[x.size() - 1] = -INFINITY;
      HostTensor in = F32(rows, cols, x);
      for (const int k : {1, 2, 40, 256}) {
        if (k > cols) continue;
        HostTensor values(DType::kF32, rows, k);
        std::vector<int32_t> ids(static_cast<size_t>(rows) * k);
        ASSERT_THAT(be->TopK(in.t, k, values.t, ids.data()), IsOk());
        for (int r = 0; r < rows; ++r) {
          std::vector<int32_t> want_ids(k);
          std::vector<float> want_values(k);
          RowTopK(x.data() + static_cast<size_t>(r) * cols, cols, k, want_ids.data(),
                  want_values.data());
          for (int j = 0; j < k; ++j) {
            ASSERT_EQ(ids[r * k + j], want_ids[j])
                << threads << " threads, " << rows << "x" << cols << " k=" << k << " row " << r
                << " rank " << j;
            ASSERT_EQ(std::memcmp(values.f() + r * k + j, &want_values[j], sizeof(float)), 0);
          }
        }
      }
    }
  }
}

TEST(CpuBackendTopKTest, Validation) {
  std::unique_ptr<Backend> be = CreateCpuBackend({.threads = 1});
  HostTensor x(DType::kF32, 2, 10);
  std::fill(x.f(), x.f() + 20, 1.f);
  HostTensor values(DType::kF32, 2, 3);
  std::vector<int32_t> ids(6);
  EXPECT_THAT(be->TopK(x.t, 0, values.t, ids.data()), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(be->TopK(x.t, 11, values.t, ids.data()),
              StatusIs(absl::StatusCode::kInvalidArgument));  // k > cols
  EXPECT_THAT(be->TopK(x.t, 2, values.t, ids.data()),
              StatusIs(absl::StatusCode::kInvalidArgument));  // values shape
  EXPECT_THAT(be->TopK(x.t, 3, values.t, nullptr), StatusIs(absl::StatusCode::kInvalidArgument));
  HostTensor half(DType::kF16, 2, 10);
  EXPECT_THAT(be->TopK(half.t, 3, values.t, ids.data()),
              StatusIs(absl::StatusCode::kUnimplemented));
  HostTensor wide(DType::kF32, 1, 1000);
  HostTensor wide_values(DType::kF32, 1, kMaxTopK + 1);
  std::vector<int32_t> wide_ids(kMaxTopK + 1);
  EXPECT_THAT(be->TopK(wide.t, kMaxTopK + 1, wide_values.t, wide_ids.data()),
              StatusIs(absl::StatusCode::kInvalidArgument));
  ASSERT_THAT(be->TopK(x.t, 3, values.t, ids.data()), IsOk());
  EXPECT_EQ(ids, (std::vector<int32_t>{0, 1, 2, 0, 1, 2}));  // all equal: the lowest columns
}

// ---- thread pool ---------------------------------------------------------------------------

TEST(ThreadPoolTest, CoversEveryIndexOnce) {
  for (int threads : {1, 2, 5}) {
    cpu::ThreadPool pool(threads);
    EXPECT_EQ(pool.num_threads(), threads);
    for (int64_t n : {0, 1, 2, 7, 64, 1000, 100003}) {
      for (int64_t grain : {1, 3, 1000}) {
        std::vector<std::atomic<int>> hits(n);
        std::atomic<int64_t> calls{0};
        pool.ParallelFor(
            n,
            [&](int64_t b, int64_t e) {
              ASSERT_LT(b, e);
              if (e != n) {
                ASSERT_GE(e - b, grain);
              }
              for (int64_t i = b; i < e; ++i) hits[i].fetch_add(1);
              calls.fetch_add(1);
            },
            grain);
        for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << n << " " << i;
      }
    }
  }
}

TEST(ThreadPoolTest, ManyBackToBackJobsAndRestart) {
  for (int round = 0; round < 20; ++round) {
    cpu::ThreadPool pool(4);
    int64_t total = 0;
    for (int job = 0; job < 200; ++job) {
      std::atomic<int64_t> sum{0};
      pool.ParallelFor(97, [&](int64_t b, int64_t e) {
        int64_t s = 0;
        for (int64_t i = b; i < e; ++i) s += i;
        sum.fetch_add(s);
      });
      total += sum.load();
    }
    ASSERT_EQ(total, 200 * (96 * 97 / 2));
  }  // destructor joins; a hang or crash here fails the test
}

}  // namespace
}  // namespace pd::engine
