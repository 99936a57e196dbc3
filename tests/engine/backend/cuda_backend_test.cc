// The CUDA backend against the CPU reference, plus its behaviour on machines without a GPU.
//
// Without a usable device every test that needs one is skipped (GTEST_SKIP with the reason), and
// the tests that check the no-device path run instead.
//
// Tolerances, per output element, against the CPU backend's result on the same inputs (each
// derived where its test is; u = 2^-24, S = sum_j |w[i,j] x[r,j]|):
//   MatMul f32:  |gpu - cpu| <= 1e-5 * S + 1e-6. Both sides form exact F32 products and add them
//                in F32, only in different orders (cuBLAS runs plain FP32 SGEMM, no TF32);
//                reordering a k-term F32 sum moves it by at most ~k * 2^-24 * S and typically far
//                less.
//   MatMul f16:  |gpu - cpu| <= 5e-4 * S + 1e-5. Both sides round x to F16 the same way (RNE), and
//                products of halves are exact in F32, but tensor cores accumulate in F32 with
//                their own order and rounding. A wrong layout or a missed conversion shows up
//                as errors of order |y| ~ S / sqrt(k), far above this for every k tested.
//   MatMul quantized / bf16: against an F64 reference on the CPU's dequantized weights,
//                GEMV (n <= 8) 5 (k/32 + 16) u max|w| sum|x|; F16 GEMM (n > 8)
//                (2^-10 + 5e-4) S; bf16 (2^-9 + 5e-4) S; and against the CPU backend that plus
//                the CPU's own rounding of x to Q8_K / Q8_0 / BF16 (CudaQuantMatMulTest).
//   RmsNorm:     |gpu - cpu| <= 1e-5 * |cpu| + 1e-6 (the CPU sums squares in F64, the GPU in F32
//                with a tree reduction; rsqrtf is within 2 ulp).
//   GetRows, Add, AddBias, Scale, StoreKv (f32, f16, int8): bit-exact.
//   SwiGlu 1e-6 |cpu|; GeGlu one f16 ulp on rare elements; Softmax 1e-6 |cpu|;
//   Rope 1e-6 (|a| + |b|) per rotated pair; Attention V (2 ds + (2L + 48) u) with ds the score's
//                rounding bound (CudaAttentionTest), and for prompt rows (the tiled kernel, which
//                rounds queries and probabilities to F16) V_w (e^(2 ds) - 1 + 2^-11 + L 2^-25)
//                plus V_r (e_v + (4 L + 64) u), ds some 2^-11 |scale| ||q|| ||k|| (derived before
//                CudaPromptAttentionTest).
// Upload/Download/Zero/MapWeights are bit exact.
//
// On a GPU, CudaBackendTest.Timing also prints MatMul f16, RmsNorm, quantized GEMV (Q4_K, Q8_0),
// Attention decode and Attention prefill timings (bench/gpu/ reads the first two).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <ostream>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "common/status_matchers.h"
#include "engine/backend/backend.h"
#include "engine/backend/cuda/attention.cuh"
#include "engine/backend/kv_layout.h"
#include "engine/backend/kv_rotation.h"
#include "engine/quant/dtype.h"
#include "engine/quant/fp16.h"
#include "engine/quant/k_quants.h"
#include "engine/quant/q5_0.h"
#include "engine/quant/q8_0.h"

namespace pd::engine {
namespace {

using ::pd::testing::StatusIs;

// ---- tests that need no device ---------------------------------------------------------------

TEST(CudaBackendNoDeviceTest, CreateIsUnavailableWithoutDevice) {
  absl::StatusOr<std::unique_ptr<Backend>> cuda = CreateCudaBackend(0);
  if (cuda.ok()) GTEST_SKIP() << "a CUDA device is present: " << (*cuda)->name();
  EXPECT_THAT(cuda, StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_FALSE(cuda.status().message().empty());
}

TEST(CudaBackendNoDeviceTest, OutOfRangeDeviceIsUnavailable) {
  // With or without GPUs: no machine has a million of them.
  EXPECT_THAT(CreateCudaBackend(1 << 20), StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_THAT(CreateCudaBackend(-1), StatusIs(absl::StatusCode::kUnavailable));
}

// PDSERVE_CUDA_GEMV picks the quantized GEMV at Create: int8 by default, f32 on request, and a
// value it does not know is an error rather than a silent default. Needs a device (without one
// Create answers UNAVAILABLE before it reads the variable).
TEST(CudaBackendGemvModeTest, ComesFromTheEnvironment) {
  const char* before = std::getenv("PDSERVE_CUDA_GEMV");
  const std::optional<std::string> saved =
      before == nullptr ? std::nullopt : std::optional<std::string>(before);
  struct Restore {
    const std::optional<std::string>& saved;
    ~Restore() {
      if (saved) {
        setenv("PDSERVE_CUDA_GEMV", saved->c_str(), 1);
      } else {
        unsetenv("PDSERVE_CUDA_GEMV");
      }
    }
  } restore{saved};
  unsetenv("PDSERVE_CUDA_GEMV");
  absl::StatusOr<std::unique_ptr<Backend>> dflt = CreateCudaBackend(0);
  if (!dflt.ok()) GTEST_SKIP() << "needs a CUDA GPU: " << dflt.status();
  EXPECT_THAT((*dflt)->name(), ::testing::HasSubstr("int8 GEMV"));
  setenv("PDSERVE_CUDA_GEMV", "f32", 1);
  absl::StatusOr<std::unique_ptr<Backend>> f32 = CreateCudaBackend(0);
  PD_ASSERT_OK(f32.status());
  EXPECT_THAT((*f32)->name(), ::testing::HasSubstr("f32 GEMV"));
  setenv("PDSERVE_CUDA_GEMV", "int4", 1);
  absl::StatusOr<std::unique_ptr<Backend>> bad = CreateCudaBackend(0);
  EXPECT_THAT(bad, StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(bad.status().message(), ::testing::HasSubstr("PDSERVE_CUDA_GEMV=int4"));
}

// ---- helpers -----------------------------------------------------------------------------------

std::vector<float> RandomFloats(size_t n, uint32_t seed, float lo = -1.f, float hi = 1.f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& f : v) f = dist(rng);
  return v;
}

std::vector<uint16_t> ToF16(const std::vector<float>& v) {
  std::vector<uint16_t> h(v.size());
  for (size_t i = 0; i < v.size(); ++i) h[i] = F32ToF16(v[i]);
  return h;
}

// Memory owned by one backend, with a Tensor view of it.
struct Owned {
  std::unique_ptr<Buffer> buffer;  // empty for CPU-mapped weights (the host bytes are used)
  Tensor t;
};

// A tensor of `type` [rows, cols] in `backend`'s memory holding `host` (row_bytes * rows bytes).
Owned Put(Backend& backend, DType type, int64_t rows, int64_t cols, const void* host) {
  Owned o;
  o.t.type = type;
  o.t.rows = rows;
  o.t.cols = cols;
  absl::StatusOr<std::unique_ptr<Buffer>> buf = backend.Allocate(o.t.bytes());
  PD_CHECK_OK(buf.status());
  o.buffer = *std::move(buf);
  o.t.data = o.buffer->data();
  if (host != nullptr) PD_CHECK_OK(backend.Upload(o.t.data, host, o.t.bytes()));
  return o;
}

// Weights through MapWeights, as the model loader does it. `host` must outlive the result.
Owned MapW(Backend& backend, DType type, int64_t rows, int64_t cols, const void* host) {
  Tensor h;
  h.type = type;
  h.rows = rows;
  h.cols = cols;
  h.data = const_cast<void*>(host);
  Owned o;
  absl::StatusOr<Tensor> t = backend.MapWeights(h, &o.buffer);
  PD_CHECK_OK(t.status());
  o.t = *t;
  return o;
}

std::vector<float> Get(Backend& backend, const Tensor& t) {
  std::vector<float> out(static_cast<size_t>(t.numel()));
  PD_CHECK_OK(backend.Download(out.data(), t.data, t.bytes()));
  PD_CHECK_OK(backend.Synchronize());
  return out;
}

class CudaBackendTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<Backend>> cuda = CreateCudaBackend(0);
    if (!cuda.ok()) GTEST_SKIP() << "needs a CUDA GPU: " << cuda.status();
    cuda_ = *std::move(cuda);
    cpu_ = CreateCpuBackend();
  }

  std::unique_ptr<Backend> cuda_;
  std::unique_ptr<Backend> cpu_;
};

// ---- memory ------------------------------------------------------------------------------------

TEST_F(CudaBackendTest, UploadDownloadRoundTrip) {
  for (size_t bytes : {size_t{1}, size_t{3}, size_t{4096}, (size_t{1} << 20) + 7}) {
    SCOPED_TRACE(bytes);
    std::vector<uint8_t> host(bytes);
    std::mt19937 rng(static_cast<uint32_t>(bytes));
    for (uint8_t& b : host) b = static_cast<uint8_t>(rng());
    absl::StatusOr<std::unique_ptr<Buffer>> buf = cuda_->Allocate(bytes + 16);
    PD_ASSERT_OK(buf.status());
    ASSERT_GE((*buf)->size(), bytes + 16);
    // At an odd offset, to cover unaligned copies.
    char* dst = static_cast<char*>((*buf)->data()) + 5;
    PD_ASSERT_OK(cuda_->Upload(dst, host.data(), bytes));
    std::vector<uint8_t> back(bytes, 0xAB);
    PD_ASSERT_OK(cuda_->Download(back.data(), dst, bytes));
    PD_ASSERT_OK(cuda_->Synchronize());
    EXPECT_EQ(back, host);
  }
}

TEST_F(CudaBackendTest, ZeroClearsOnlyItsRange) {
  std::vector<uint8_t> host(1000, 0x5A);
  Owned o = Put(*cuda_, DType::kF32, 1, 250, host.data());
  PD_ASSERT_OK(cuda_->Zero(static_cast<char*>(o.t.data) + 100, 301));
  std::vector<uint8_t> back(1000);
  PD_ASSERT_OK(cuda_->Download(back.data(), o.t.data, back.size()));
  PD_ASSERT_OK(cuda_->Synchronize());
  for (size_t i = 0; i < back.size(); ++i) {
    ASSERT_EQ(back[i], (i >= 100 && i < 401) ? 0 : 0x5A) << "byte " << i;
  }
}

TEST_F(CudaBackendTest, MapWeightsCopiesToDevice) {
  const std::vector<uint16_t> w = ToF16(RandomFloats(3 * 37, 7));
  Owned o = MapW(*cuda_, DType::kF16, 3, 37, w.data());
  ASSERT_NE(o.buffer, nullptr);
  EXPECT_NE(o.t.data, static_cast<const void*>(w.data()));
  EXPECT_EQ(o.t.type, DType::kF16);
  EXPECT_EQ(o.t.rows, 3);
  EXPECT_EQ(o.t.cols, 37);
  std::vector<uint16_t> back(w.size());
  PD_ASSERT_OK(cuda_->Download(back.data(), o.t.data, o.t.bytes()));
  PD_ASSERT_OK(cuda_->Synchronize());
  EXPECT_EQ(back, w);
}

TEST_F(CudaBackendTest, AllocateTooMuchIsResourceExhausted) {
  // 1 PiB: more than any device has.
  EXPECT_THAT(cuda_->Allocate(size_t{1} << 50), StatusIs(absl::StatusCode::kResourceExhausted));
  // The failure must not poison later calls.
  PD_EXPECT_OK(cuda_->Allocate(1024).status());
  PD_EXPECT_OK(cuda_->Synchronize());
}

// ---- MatMul parity -----------------------------------------------------------------------------

struct MatMulCase {
  DType type;
  int64_t m, k, n;  // w[m, k], x[n, k], y[n, m]
};

void PrintTo(const MatMulCase& c, std::ostream* os) {
  *os << Traits(c.type).name << " w[" << c.m << ", " << c.k << "] x[" << c.n << ", " << c.k << "]";
}

std::string CaseName(const ::testing::TestParamInfo<MatMulCase>& info) {
  const MatMulCase& c = info.param;
  return std::string(Traits(c.type).name) + "_m" + std::to_string(c.m) + "_k" +
         std::to_string(c.k) + "_n" + std::to_string(c.n);
}

class CudaMatMulTest : public CudaBackendTest, public ::testing::WithParamInterface<MatMulCase> {};

TEST_P(CudaMatMulTest, MatchesCpu) {
  const MatMulCase c = GetParam();
  const std::vector<float> w32 = RandomFloats(static_cast<size_t>(c.m * c.k), 1);
  const std::vector<float> x = RandomFloats(static_cast<size_t>(c.n * c.k), 2);
  const std::vector<uint16_t> w16 = ToF16(w32);
  const void* w_host = c.type == DType::kF16 ? static_cast<const void*>(w16.data())
                                             : static_cast<const void*>(w32.data());
  // y starts as NaN so that an element the op forgets to write fails the comparison.
  const std::vector<float> nans(static_cast<size_t>(c.n * c.m),
                                std::numeric_limits<float>::quiet_NaN());

  std::vector<float> results[2];
  Backend* backends[2] = {cpu_.get(), cuda_.get()};
  for (int b = 0; b < 2; ++b) {
    Backend& be = *backends[b];
    Owned w = MapW(be, c.type, c.m, c.k, w_host);
    Owned xt = Put(be, DType::kF32, c.n, c.k, x.data());
    Owned y = Put(be, DType::kF32, c.n, c.m, nans.data());
    PD_ASSERT_OK(be.MatMul(w.t, xt.t, y.t)) << be.name();
    results[b] = Get(be, y.t);
  }

  const double rel = c.type == DType::kF32 ? 1e-5 : 5e-4;
  const double abs = c.type == DType::kF32 ? 1e-6 : 1e-5;
  int failures = 0;
  for (int64_t r = 0; r < c.n; ++r) {
    for (int64_t i = 0; i < c.m; ++i) {
      double s = 0;  // sum of |products|: the scale of the rounding error
      for (int64_t j = 0; j < c.k; ++j) {
        const float wv = c.type == DType::kF16 ? F16ToF32(w16[i * c.k + j]) : w32[i * c.k + j];
        s += std::fabs(static_cast<double>(wv) * x[r * c.k + j]);
      }
      const float cpu = results[0][r * c.m + i];
      const float gpu = results[1][r * c.m + i];
      const double tol = rel * s + abs;
      if (!(std::fabs(static_cast<double>(gpu) - cpu) <= tol) && ++failures <= 10) {
        ADD_FAILURE() << "y[" << r << ", " << i << "]: cuda " << gpu << " vs cpu " << cpu
                      << " (tolerance " << tol << ")";
      }
    }
  }
  EXPECT_EQ(failures, 0);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, CudaMatMulTest,
    ::testing::Values(
        // Degenerate and odd shapes, n = 1 (decode) and n = 7 (small odd batch).
        MatMulCase{DType::kF32, 1, 1, 1}, MatMulCase{DType::kF32, 7, 33, 1},
        MatMulCase{DType::kF32, 33, 17, 7}, MatMulCase{DType::kF32, 129, 257, 7},
        MatMulCase{DType::kF32, 300, 1000, 17}, MatMulCase{DType::kF32, 64, 4095, 1},
        MatMulCase{DType::kF32, 256, 512, 64}, MatMulCase{DType::kF16, 1, 1, 1},
        MatMulCase{DType::kF16, 7, 33, 1}, MatMulCase{DType::kF16, 33, 17, 7},
        MatMulCase{DType::kF16, 129, 257, 7}, MatMulCase{DType::kF16, 300, 1000, 17},
        MatMulCase{DType::kF16, 64, 4095, 1}, MatMulCase{DType::kF16, 256, 512, 64},
        MatMulCase{DType::kF16, 512, 4096, 3}),
    CaseName);

TEST_F(CudaBackendTest, MatMulRejectsMismatchedShapes) {
  Owned w = Put(*cuda_, DType::kF32, 8, 16, nullptr);
  Owned x = Put(*cuda_, DType::kF32, 2, 15, nullptr);  // k mismatch
  Owned y = Put(*cuda_, DType::kF32, 2, 8, nullptr);
  EXPECT_THAT(cuda_->MatMul(w.t, x.t, y.t), StatusIs(absl::StatusCode::kInvalidArgument));
  Owned x_ok = Put(*cuda_, DType::kF32, 2, 16, nullptr);
  Owned y_bad = Put(*cuda_, DType::kF32, 3, 8, nullptr);  // n mismatch
  EXPECT_THAT(cuda_->MatMul(w.t, x_ok.t, y_bad.t), StatusIs(absl::StatusCode::kInvalidArgument));
  PD_EXPECT_OK(cuda_->Synchronize());
}

// ---- RmsNorm parity ----------------------------------------------------------------------------

struct RmsNormCase {
  int64_t rows, cols;
  bool weight;
};

void PrintTo(const RmsNormCase& c, std::ostream* os) {
  *os << "x[" << c.rows << ", " << c.cols << "]" << (c.weight ? " with weight" : " no weight");
}

std::string RmsName(const ::testing::TestParamInfo<RmsNormCase>& info) {
  return "r" + std::to_string(info.param.rows) + "_c" + std::to_string(info.param.cols) +
         (info.param.weight ? "_w" : "_nw");
}

class CudaRmsNormTest : public CudaBackendTest,
                        public ::testing::WithParamInterface<RmsNormCase> {};

TEST_P(CudaRmsNormTest, MatchesCpu) {
  const RmsNormCase c = GetParam();
  const float eps = 1e-6f;
  const std::vector<float> x = RandomFloats(static_cast<size_t>(c.rows * c.cols), 3);
  const std::vector<float> w = RandomFloats(static_cast<size_t>(c.cols), 4, 0.5f, 1.5f);
  const std::vector<float> nans(x.size(), std::numeric_limits<float>::quiet_NaN());

  std::vector<float> results[2];
  Backend* backends[2] = {cpu_.get(), cuda_.get()};
  for (int b = 0; b < 2; ++b) {
    Backend& be = *backends[b];
    Owned xt = Put(be, DType::kF32, c.rows, c.cols, x.data());
    Owned wt = Put(be, DType::kF32, 1, c.cols, w.data());
    Owned y = Put(be, DType::kF32, c.rows, c.cols, nans.data());
    Tensor wv = wt.t;
    if (!c.weight) wv.data = nullptr;
    PD_ASSERT_OK(be.RmsNorm(xt.t, wv, eps, y.t)) << be.name();
    results[b] = Get(be, y.t);
  }
  int failures = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const float cpu = results[0][i], gpu = results[1][i];
    const double tol = 1e-5 * std::fabs(cpu) + 1e-6;
    if (!(std::fabs(static_cast<double>(gpu) - cpu) <= tol) && ++failures <= 10) {
      ADD_FAILURE() << "y[" << i / c.cols << ", " << i % c.cols << "]: cuda " << gpu << " vs cpu "
                    << cpu;
    }
  }
  EXPECT_EQ(failures, 0);
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaRmsNormTest,
                         ::testing::Values(RmsNormCase{1, 1, true}, RmsNormCase{7, 31, true},
                                           RmsNormCase{3, 32, false}, RmsNormCase{5, 1000, true},
                                           RmsNormCase{1, 1024, true}, RmsNormCase{7, 4096, true},
                                           RmsNormCase{2, 5120, false},
                                           RmsNormCase{64, 4097, true}),
                         RmsName);

TEST_F(CudaBackendTest, RmsNormInPlaceMatchesOutOfPlace) {
  const std::vector<float> x = RandomFloats(3 * 2048, 5);
  const std::vector<float> w = RandomFloats(2048, 6, 0.5f, 1.5f);
  Owned a = Put(*cuda_, DType::kF32, 3, 2048, x.data());
  Owned b = Put(*cuda_, DType::kF32, 3, 2048, nullptr);
  Owned wt = Put(*cuda_, DType::kF32, 1, 2048, w.data());
  PD_ASSERT_OK(cuda_->RmsNorm(a.t, wt.t, 1e-5f, b.t));
  PD_ASSERT_OK(cuda_->RmsNorm(a.t, wt.t, 1e-5f, a.t));
  EXPECT_EQ(Get(*cuda_, a.t), Get(*cuda_, b.t));
}

// ---- quantized tables and weights ------------------------------------------------------------

// Rows of `type` with random codes and scales in every block: every bit pattern of the code and
// scale bytes is a valid block, so random bytes cover the formats' corners better than a
// quantizer would (and take no time; our k-quant quantizers need seconds per million weights).
// Only the f16 super-scales are set, to sizes that keep the weights within about +-1; the float
// types get values uniform in [-1, 1].
std::vector<uint8_t> RandomWeights(DType type, int64_t rows, int64_t cols, uint32_t seed) {
  const size_t row_bytes = RowBytes(type, cols);
  std::vector<uint8_t> w(row_bytes * static_cast<size_t>(rows));
  if (type == DType::kF32 || type == DType::kF16 || type == DType::kBF16) {
    const std::vector<float> f = RandomFloats(static_cast<size_t>(rows * cols), seed);
    for (size_t i = 0; i < f.size(); ++i) {
      if (type == DType::kF32) {
        std::memcpy(w.data() + 4 * i, &f[i], 4);
      } else {
        const uint16_t h = type == DType::kF16 ? F32ToF16(f[i]) : F32ToBf16(f[i]);
        std::memcpy(w.data() + 2 * i, &h, 2);
      }
    }
    return w;
  }
  std::mt19937 rng(seed);
  for (uint8_t& b : w) b = static_cast<uint8_t>(rng());
  std::uniform_real_distribution<float> unit(0.5f, 1.f);
  auto put_f16 = [&](uint8_t* p, float v) {
    const uint16_t h = F32ToF16(v);
    std::memcpy(p, &h, 2);
  };
  const int64_t n_blocks = rows * cols / Traits(type).block_size;
  const size_t block_bytes = Traits(type).block_bytes;
  for (int64_t b = 0; b < n_blocks; ++b) {
    uint8_t* blk = w.data() + static_cast<size_t>(b) * block_bytes;
    switch (type) {
      case DType::kQ8_0:  // d * q, q in [-128, 127]
        put_f16(blk + offsetof(BlockQ8_0, d), unit(rng) / 127.f);
        break;
      case DType::kQ4_0:  // d * (c - 8), c in [0, 15]
        put_f16(blk + offsetof(BlockQ4_0, d), unit(rng) / 8.f);
        break;
      case DType::kQ5_0:  // d * (c - 16), c in [0, 31]
        put_f16(blk + offsetof(BlockQ5_0, d), unit(rng) / 16.f);
        break;
      case DType::kQ2_K:  // (d sc) q - dmin m, sc and m in [0, 15], q in [0, 3]
        put_f16(blk + offsetof(BlockQ2_K, d), unit(rng) / (15.f * 3.f));
        put_f16(blk + offsetof(BlockQ2_K, dmin), unit(rng) / (15.f * 2.f));
        break;
      case DType::kQ3_K:  // d sc q, sc in [-32, 31], q in [-4, 3]
        put_f16(blk + offsetof(BlockQ3_K, d), unit(rng) / (32.f * 4.f));
        break;
      case DType::kQ4_K:  // (d sc) q - dmin m, sc and m in [0, 63], q in [0, 15]
        put_f16(blk + offsetof(BlockQ4_K, d), unit(rng) / (63.f * 15.f));
        put_f16(blk + offsetof(BlockQ4_K, dmin), unit(rng) / (63.f * 2.f));
        break;
      case DType::kQ5_K:  // (d sc) q - dmin m, sc and m in [0, 63], q in [0, 31]
        put_f16(blk + offsetof(BlockQ5_K, d), unit(rng) / (63.f * 31.f));
        put_f16(blk + offsetof(BlockQ5_K, dmin), unit(rng) / (63.f * 2.f));
        break;
      case DType::kQ6_K:  // d sc (q - 32), sc in [-128, 127], q - 32 in [-32, 31]
        put_f16(blk + offsetof(BlockQ6_K, d), unit(rng) / (128.f * 32.f));
        break;
      default:
        PD_CHECK_MSG(false, "RandomWeights: no random blocks for this type");
    }
  }
  return w;
}

// The CPU backend's dequantization of every row (its GetRows): the reference weights.
std::vector<float> CpuDequantize(Backend& cpu, DType type, int64_t rows, int64_t cols,
                                 const std::vector<uint8_t>& w) {
  Owned table = MapW(cpu, type, rows, cols, w.data());
  std::vector<int32_t> ids(static_cast<size_t>(rows));
  for (int64_t i = 0; i < rows; ++i) ids[i] = static_cast<int32_t>(i);
  Owned out = Put(cpu, DType::kF32, rows, cols, nullptr);
  PD_CHECK_OK(cpu.GetRows(table.t, ids, out.t));
  return Get(cpu, out.t);
}

// ---- GetRows parity
// ------------------------------------------------------------------------------ Bit-exact: both
// sides evaluate engine/quant's dequantization formulas in the same order with no fused
// multiply-adds, and widen f16/bf16 exactly.

struct GetRowsCase {
  DType type;
  int64_t rows, cols;
};

void PrintTo(const GetRowsCase& c, std::ostream* os) {
  *os << Traits(c.type).name << " table[" << c.rows << ", " << c.cols << "]";
}

std::string GetRowsName(const ::testing::TestParamInfo<GetRowsCase>& info) {
  return std::string(Traits(info.param.type).name) + "_r" + std::to_string(info.param.rows) + "_c" +
         std::to_string(info.param.cols);
}

class CudaGetRowsTest : public CudaBackendTest,
                        public ::testing::WithParamInterface<GetRowsCase> {};

TEST_P(CudaGetRowsTest, MatchesCpuBitForBit) {
  const GetRowsCase c = GetParam();
  const std::vector<uint8_t> table = RandomWeights(c.type, c.rows, c.cols, 21);
  // First and last row, repeats, and a prompt's worth of random ids.
  std::vector<int32_t> ids = {0, static_cast<int32_t>(c.rows - 1), 5, 5};
  std::mt19937 rng(22);
  for (int i = 0; i < 29; ++i) ids.push_back(static_cast<int32_t>(rng() % c.rows));
  const std::vector<float> nans(ids.size() * static_cast<size_t>(c.cols),
                                std::numeric_limits<float>::quiet_NaN());
  std::vector<float> results[2];
  Backend* backends[2] = {cpu_.get(), cuda_.get()};
  for (int b = 0; b < 2; ++b) {
    Backend& be = *backends[b];
    Owned t = MapW(be, c.type, c.rows, c.cols, table.data());
    Owned out = Put(be, DType::kF32, static_cast<int64_t>(ids.size()), c.cols, nans.data());
    PD_ASSERT_OK(be.GetRows(t.t, ids, out.t)) << be.name();
    results[b] = Get(be, out.t);
  }
  ASSERT_EQ(results[0].size(), results[1].size());
  EXPECT_EQ(std::memcmp(results[0].data(), results[1].data(), results[0].size() * 4), 0);
  for (size_t i = 0; i < results[0].size(); ++i) {
    ASSERT_EQ(BitsFromFp32(results[1][i]), BitsFromFp32(results[0][i]))
        << "out[" << i / c.cols << ", " << i % c.cols << "]: cuda " << results[1][i] << " vs cpu "
        << results[0][i];
  }
}

INSTANTIATE_TEST_SUITE_P(
    Types, CudaGetRowsTest,
    ::testing::Values(
        // Gemma 3 270M's embedding width (its table is 262144 rows; fewer keep the test quick),
        // a Llama 7B row, and the F32 activations Model picks output rows from.
        GetRowsCase{DType::kF32, 64, 640}, GetRowsCase{DType::kF16, 1000, 640},
        GetRowsCase{DType::kBF16, 1000, 640}, GetRowsCase{DType::kQ8_0, 4096, 640},
        GetRowsCase{DType::kQ5_0, 4096, 640}, GetRowsCase{DType::kQ4_K, 1000, 4096},
        GetRowsCase{DType::kQ6_K, 1000, 4096}, GetRowsCase{DType::kQ8_0, 300, 4096},
        GetRowsCase{DType::kQ4_K, 300, 2048}, GetRowsCase{DType::kQ6_K, 300, 2048},
        // The other GGUF types: Q4_0 (Q4_0 files' embeddings), Q2_K, Q3_K and Q5_K (the tables
        // of Q2_K ... Q5_K_M files).
        GetRowsCase{DType::kQ4_0, 4096, 640}, GetRowsCase{DType::kQ4_0, 300, 4096},
        GetRowsCase{DType::kQ2_K, 1000, 4096}, GetRowsCase{DType::kQ3_K, 1000, 4096},
        GetRowsCase{DType::kQ5_K, 1000, 4096}, GetRowsCase{DType::kQ2_K, 300, 2048},
        GetRowsCase{DType::kQ3_K, 300, 2048}, GetRowsCase{DType::kQ5_K, 300, 2048}),
    GetRowsName);

TEST_F(CudaBackendTest, GetRowsRejectsBadIdsAndTypes) {
  Owned table = Put(*cuda_, DType::kF32, 4, 64, nullptr);
  Owned out = Put(*cuda_, DType::kF32, 2, 64, nullptr);
  const int32_t bad[] = {0, 4};
  EXPECT_THAT(cuda_->GetRows(table.t, bad, out.t), StatusIs(absl::StatusCode::kInvalidArgument));
  const int32_t negative[] = {-1, 0};
  EXPECT_THAT(cuda_->GetRows(table.t, negative, out.t),
              StatusIs(absl::StatusCode::kInvalidArgument));
  Owned w8 = Put(*cuda_, DType::kW8A8, 4, 256, nullptr);
  Owned out256 = Put(*cuda_, DType::kF32, 2, 256, nullptr);
  const int32_t ok[] = {0, 3};
  EXPECT_THAT(cuda_->GetRows(w8.t, ok, out256.t),
              StatusIs(absl::StatusCode::kUnimplemented, "w8a8"));
  PD_EXPECT_OK(cuda_->Synchronize());
}

// ---- quantized and bf16 MatMul parity -----------------------------------------------------------
//
// The reference: y_ref = W x in F64, with W the CPU backend's dequantization of the weights (its
// GetRows) and x the F32 activations. Per output element, with S = sum_j |W[i,j] x[r,j]|,
// T = max_j |W[i,j]| * sum_j |x[r,j]| and u = 2^-24:
//   GEMV (n <= 8, quantized): |gpu - y_ref| <= 5 (k/32 + 16) u T + 1e-6. The kernel sums each
//     unit's codes times x, scales once per sub-block (Q2_K, Q4_K, Q5_K: minus dmin m times the
//     sum of x), then adds the units' sub-block terms along a lane (k/256 steps; k/128 for Q2_K
//     and Q3_K, whose units span four sub-blocks) and across the warp (5 steps). Every term it
//     adds is at most 5 max|W| times a share of sum |x| (the d sc q and dmin m of Q2_K, Q4_K and
//     Q5_K can each be twice the largest weight while their difference is small), and each
//     addition rounds by u of the running magnitude: k/32 + 16 bounds the additions on any path
//     with room to spare.
//   GEMM (n > 8: weights expanded to F16, activations rounded to F16, tensor cores):
//     |gpu - y_ref| <= (2^-10 + 5e-4) S + 2^-24 sum|x| + 1e-5: each factor of a product is
//     rounded to F16 once (relative 2^-11 each; weights below f16's normal range lose at most
//     2^-25 absolutely), and 5e-4 S covers the tensor cores' F32 accumulation as for MatMul f16.
//   BF16 weights (exact in the reference) with activations rounded to BF16 (2^-9):
//     |gpu - y_ref| <= (2^-9 + 5e-4) S + 1e-5.
// With the int8 GEMV (the default; PDSERVE_CUDA_GEMV=f32 turns it off, and the backend's name says
// which: "int8 GEMV" or "f32 GEMV") the Q4_K, Q6_K and
// Q8_0 GEMVs quantize x as the CPU backend does (matmul_q8act.cu) and dot the codes exactly in
// int32: the reference then takes x as those quantized values (the CPU's own quantizer,
// dequantized in F64), the same GEMV bound applies with x replaced by them, and the CPU, which
// dots the same codes, must agree within that bound plus 1e-5 S: no activation-rounding term.
// Otherwise, against the CPU backend itself, which quantizes x to Q8_K (k-quants) or Q8_0 blocks
// first: |gpu - cpu| <= tol_ref + sum_j |W[i,j]| e_j + 1e-5 S, with e_j = amax(x's block at j) *
// (1/254 + 2^-11) the activation rounding (half a step of d = amax / 127, plus Q8_0's f16 d) and
// e_j = 2^-9 |x_j| for BF16. That bound is loose (the errors are random, not aligned); the tight
// check is the one against y_ref.

struct QuantMatMulCase {
  DType type;
  int64_t m, k, n;  // w[m, k], x[n, k], y[n, m]
};

void PrintTo(const QuantMatMulCase& c, std::ostream* os) {
  *os << Traits(c.type).name << " w[" << c.m << ", " << c.k << "] x[" << c.n << ", " << c.k << "]";
}

std::string QuantCaseName(const ::testing::TestParamInfo<QuantMatMulCase>& info) {
  const QuantMatMulCase& c = info.param;
  return std::string(Traits(c.type).name) + "_m" + std::to_string(c.m) + "_k" +
         std::to_string(c.k) + "_n" + std::to_string(c.n);
}

class CudaQuantMatMulTest : public CudaBackendTest,
                            public ::testing::WithParamInterface<QuantMatMulCase> {};

TEST_P(CudaQuantMatMulTest, MatchesReferenceAndCpu) {
  const QuantMatMulCase c = GetParam();
  const std::vector<uint8_t> w = RandomWeights(c.type, c.m, c.k, 31);
  const std::vector<float> x = RandomFloats(static_cast<size_t>(c.n * c.k), 32);
  const std::vector<float> nans(static_cast<size_t>(c.n * c.m),
                                std::numeric_limits<float>::quiet_NaN());
  const std::vector<float> wf = CpuDequantize(*cpu_, c.type, c.m, c.k, w);

  std::vector<float> results[2];
  Backend* backends[2] = {cpu_.get(), cuda_.get()};
  for (int b = 0; b < 2; ++b) {
    Backend& be = *backends[b];
    Owned wt = MapW(be, c.type, c.m, c.k, w.data());
    Owned xt = Put(be, DType::kF32, c.n, c.k, x.data());
    Owned y = Put(be, DType::kF32, c.n, c.m, nans.data());
    PD_ASSERT_OK(be.MatMul(wt.t, xt.t, y.t)) << be.name();
    results[b] = Get(be, y.t);
  }

  const bool bf16 = c.type == DType::kBF16;
  const bool gemv = !bf16 && c.n <= 8;
  // The backend names its GEMV mode (PDSERVE_CUDA_GEMV, read once at Create); the int8 GEMV
  // covers Q4_K, Q6_K and Q8_0 (cuda::Q8ActGemvFormat).
  const bool int8 = gemv && cuda_->name().find("int8 GEMV") != std::string_view::npos &&
                    (c.type == DType::kQ4_K || c.type == DType::kQ6_K || c.type == DType::kQ8_0);
  // The activations the reference multiplies: x, or (int8) the CPU quantizer's values of x.
  std::vector<float> xref = x;
  if (int8) {
    for (int64_t r = 0; r < c.n; ++r) {
      const float* xr = x.data() + r * c.k;
      float* out = xref.data() + r * c.k;
      if (c.type == DType::kQ8_0) {
        std::vector<BlockQ8_0> q(static_cast<size_t>(c.k / 32));
        QuantizeRowQ8_0Act(xr, q.data(), c.k);
        DequantizeRowQ8_0(q.data(), out, c.k);
      } else {
        std::vector<BlockQ8_K> q(static_cast<size_t>(c.k / 256));
        QuantizeRow(xr, q.data(), c.k);
        DequantizeRow(q.data(), out, c.k);
      }
    }
  }
  // The CPU's activation blocks: 32 (Q8_0) or 256 (Q8_K) values; BF16 rounds each value alone.
  const int64_t act_block =
      bf16 ? 1
           : (c.type == DType::kQ8_0 || c.type == DType::kQ4_0 || c.type == DType::kQ5_0) ? 32
                                                                                           : 256;
  constexpr double u = 1.0 / (1 << 24);
  int failures = 0;
  for (int64_t r = 0; r < c.n; ++r) {
    const float* xr = xref.data() + r * c.k;
    double sum_abs_x = 0;
    std::vector<double> err_x(static_cast<size_t>(c.k));  // e_j: the CPU's activation rounding
    for (int64_t j0 = 0; j0 < c.k; j0 += act_block) {
      double amax = 0;
      for (int64_t j = j0; j < j0 + act_block; ++j) amax = std::max(amax, std::fabs(double{xr[j]}));
      for (int64_t j = j0; j < j0 + act_block; ++j) {
        err_x[j] = int8   ? 0
                   : bf16 ? std::fabs(double{xr[j]}) / 512
                          : amax * (1.0 / 254 + 1.0 / 2048);
      }
    }
    for (int64_t j = 0; j < c.k; ++j) sum_abs_x += std::fabs(double{xr[j]});
    for (int64_t i = 0; i < c.m; ++i) {
      const float* wi = wf.data() + i * c.k;
      double ref = 0, s = 0, wmax = 0, act = 0;
      for (int64_t j = 0; j < c.k; ++j) {
        ref += double{wi[j]} * xr[j];
        s += std::fabs(double{wi[j]} * xr[j]);
        wmax = std::max(wmax, std::fabs(double{wi[j]}));
        act += std::fabs(double{wi[j]}) * err_x[j];
      }
      const double t = wmax * sum_abs_x;
      double tol_ref;
      if (gemv) {
        tol_ref = 5 * (c.k / 32.0 + 16) * u * t + 1e-6;
      } else if (bf16) {
        tol_ref = (1.0 / 512 + 5e-4) * s + 1e-5;
      } else {
        tol_ref = (1.0 / 1024 + 5e-4) * s + u * sum_abs_x + 1e-5;
      }
      const double tol_cpu = tol_ref + act + 1e-5 * s;
      const double gpu = results[1][r * c.m + i], cpu = results[0][r * c.m + i];
      if (!(std::fabs(gpu - ref) <= tol_ref) && ++failures <= 10) {
        ADD_FAILURE() << "y[" << r << ", " << i << "]: cuda " << gpu << " vs reference " << ref
                      << " (tolerance " << tol_ref << ")";
      }
      if (!(std::fabs(gpu - cpu) <= tol_cpu) && ++failures <= 10) {
        ADD_FAILURE() << "y[" << r << ", " << i << "]: cuda " << gpu << " vs cpu " << cpu
                      << " (tolerance " << tol_cpu << ")";
      }
    }
  }
  EXPECT_EQ(failures, 0);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, CudaQuantMatMulTest,
    ::testing::Values(
        // Gemma 3 270M: its 640-wide inputs are Q5_0 / Q8_0 in Q4_K_M files (ffn_gate/up
        // w[2048, 640]); ffn_down w[640, 2048] is a k-quant. Decode (n = 1), a few sequences
        // (GEMV up to 8 rows), and prompts (F16 GEMM from 9 rows on).
        QuantMatMulCase{DType::kQ5_0, 2048, 640, 1}, QuantMatMulCase{DType::kQ5_0, 2048, 640, 5},
        QuantMatMulCase{DType::kQ5_0, 2048, 640, 37}, QuantMatMulCase{DType::kQ8_0, 2048, 640, 1},
        QuantMatMulCase{DType::kQ8_0, 2048, 640, 64}, QuantMatMulCase{DType::kQ4_K, 640, 2048, 1},
        QuantMatMulCase{DType::kQ4_K, 640, 2048, 9}, QuantMatMulCase{DType::kQ6_K, 640, 2048, 1},
        QuantMatMulCase{DType::kQ6_K, 640, 2048, 16},
        // Llama 7B: k = 4096 (attention, gate/up) and 11008 (ffn_down), rows cut to keep the F64
        // reference quick.
        QuantMatMulCase{DType::kQ4_K, 1024, 4096, 1}, QuantMatMulCase{DType::kQ4_K, 1024, 4096, 8},
        QuantMatMulCase{DType::kQ4_K, 257, 4096, 33}, QuantMatMulCase{DType::kQ6_K, 1024, 4096, 3},
        QuantMatMulCase{DType::kQ6_K, 300, 11008, 1}, QuantMatMulCase{DType::kQ6_K, 300, 11008, 12},
        QuantMatMulCase{DType::kQ8_0, 1024, 4096, 8}, QuantMatMulCase{DType::kQ8_0, 256, 11008, 2},
        QuantMatMulCase{DType::kQ4_K, 256, 11008, 7},
        // Q4_0, Q2_K, Q3_K and Q5_K (Q4_0 and Q2_K ... Q5_K_M files): decode, the GEMV's widest
        // batch, and the F16 GEMM. k = 11008 is 43 super-blocks, so the two-super-block warp
        // steps of Q2_K and Q3_K end on half a step.
        QuantMatMulCase{DType::kQ4_0, 2048, 640, 1}, QuantMatMulCase{DType::kQ4_0, 2048, 640, 6},
        QuantMatMulCase{DType::kQ4_0, 2048, 640, 37}, QuantMatMulCase{DType::kQ4_0, 1024, 4096, 8},
        QuantMatMulCase{DType::kQ4_0, 256, 11008, 2}, QuantMatMulCase{DType::kQ2_K, 640, 2048, 1},
        QuantMatMulCase{DType::kQ2_K, 1024, 4096, 8}, QuantMatMulCase{DType::kQ2_K, 300, 11008, 3},
        QuantMatMulCase{DType::kQ2_K, 257, 4096, 33}, QuantMatMulCase{DType::kQ3_K, 640, 2048, 2},
        QuantMatMulCase{DType::kQ3_K, 1024, 4096, 5}, QuantMatMulCase{DType::kQ3_K, 300, 11008, 1},
        QuantMatMulCase{DType::kQ3_K, 300, 11008, 12}, QuantMatMulCase{DType::kQ5_K, 640, 2048, 1},
        QuantMatMulCase{DType::kQ5_K, 1024, 4096, 4}, QuantMatMulCase{DType::kQ5_K, 256, 11008, 8},
        QuantMatMulCase{DType::kQ5_K, 640, 2048, 9},
        // More weights than one F16 slab (32M elements): the GEMM runs in two slabs.
        QuantMatMulCase{DType::kQ8_0, 16384, 2560, 9}, QuantMatMulCase{DType::kBF16, 1024, 4096, 1},
        QuantMatMulCase{DType::kBF16, 300, 640, 17}),
    QuantCaseName);

// MatMulGroup gives exactly what MatMul gives each weight, whichever way it runs the group: one
// quantization and grouped int8 GEMVs (every weight an int8-GEMV format with the same activation
// quantization, n <= kMaxGemvRows), or MatMul per weight (the rest).
struct GroupCase {
  std::string name;
  std::vector<std::pair<DType, int64_t>> weights;  // type, rows
  int64_t k, n;
};

class CudaMatMulGroupTest : public CudaBackendTest,
                            public ::testing::WithParamInterface<GroupCase> {};

TEST_P(CudaMatMulGroupTest, MatchesMatMulBitForBit) {
  const GroupCase& c = GetParam();
  const std::vector<float> x = RandomFloats(static_cast<size_t>(c.n * c.k), 43);
  Owned xt = Put(*cuda_, DType::kF32, c.n, c.k, x.data());
  std::vector<std::vector<uint8_t>> host;
  std::vector<Owned> w, alone, grouped;
  for (size_t i = 0; i < c.weights.size(); ++i) {
    const auto [type, rows] = c.weights[i];
    host.push_back(RandomWeights(type, rows, c.k, 41 + static_cast<uint32_t>(i)));
  }
  for (size_t i = 0; i < c.weights.size(); ++i) {
    const auto [type, rows] = c.weights[i];
    w.push_back(MapW(*cuda_, type, rows, c.k, host[i].data()));
    alone.push_back(Put(*cuda_, DType::kF32, c.n, rows, nullptr));
    grouped.push_back(Put(*cuda_, DType::kF32, c.n, rows, nullptr));
    PD_ASSERT_OK(cuda_->MatMul(w[i].t, xt.t, alone[i].t));
  }
  std::vector<const Tensor*> ws;
  std::vector<Tensor*> ys;
  for (size_t i = 0; i < w.size(); ++i) {
    ws.push_back(&w[i].t);
    ys.push_back(&grouped[i].t);
  }
  const std::vector<uint8_t> orders(static_cast<size_t>(c.n), kRowOrderGemv);
  PD_ASSERT_OK(cuda_->MatMulGroup(ws, xt.t, ys, orders));
  for (size_t i = 0; i < w.size(); ++i) {
    EXPECT_EQ(Get(*cuda_, grouped[i].t), Get(*cuda_, alone[i].t))
        << "weight " << i << " (" << Traits(c.weights[i].first).name << ", " << c.weights[i].second
        << " rows)";
  }
}

INSTANTIATE_TEST_SUITE_P(
    Groups, CudaMatMulGroupTest,
    ::testing::Values(
        // Q, K, V of a Q4_K_M layer: Q4_K and Q6_K share the Q8_K activations (one quantization,
        // one launch per format); rows that are not a multiple of a thread block's 4.
        GroupCase{"qkv_q4k_q6k_n1",
                  {{DType::kQ4_K, 512}, {DType::kQ4_K, 130}, {DType::kQ6_K, 126}},
                  4096,
                  1},
        GroupCase{"qkv_q4k_q6k_n3",
                  {{DType::kQ4_K, 512}, {DType::kQ6_K, 128}, {DType::kQ4_K, 129}},
                  4096,
                  3},
        GroupCase{"gate_up_q4k_n8", {{DType::kQ4_K, 1101}, {DType::kQ4_K, 1101}}, 2048, 8},
        // More weights of one format than one launch takes (4): two launches.
        GroupCase{"six_q4k_n2",
                  {{DType::kQ4_K, 64},
                   {DType::kQ4_K, 3},
                   {DType::kQ4_K, 200},
                   {DType::kQ4_K, 1},
                   {DType::kQ4_K, 96},
                   {DType::kQ4_K, 77}},
                  1024,
                  2},
        GroupCase{
            "q8_0_n5", {{DType::kQ8_0, 640}, {DType::kQ8_0, 160}, {DType::kQ8_0, 160}}, 640, 5},
        // Q8_0 and Q4_K quantize the activations differently: MatMul per weight.
        GroupCase{"q8_0_and_q4k", {{DType::kQ8_0, 256}, {DType::kQ4_K, 256}}, 1024, 2},
        // A format without an int8 GEMV in the group, and a batch past the GEMV (the GEMM).
        GroupCase{"q4k_and_q5_0", {{DType::kQ4_K, 256}, {DType::kQ5_0, 256}}, 1024, 1},
        GroupCase{"q4k_n9_gemm", {{DType::kQ4_K, 256}, {DType::kQ6_K, 64}}, 1024, 9},
        GroupCase{"f16_pair", {{DType::kF16, 300}, {DType::kF16, 100}}, 512, 4}),
    [](const ::testing::TestParamInfo<GroupCase>& info) { return info.param.name; });

// A group MatMul would refuse is refused with MatMul's error.
TEST_F(CudaBackendTest, MatMulGroupRefusesWhatMatMulRefuses) {
  const int64_t k = 1024, n = 2;
  const std::vector<uint8_t> wa = RandomWeights(DType::kQ4_K, 64, k, 51);
  Owned a = MapW(*cuda_, DType::kQ4_K, 64, k, wa.data());
  Owned b = MapW(*cuda_, DType::kQ4_K, 64, k, wa.data());
  const std::vector<float> x = RandomFloats(static_cast<size_t>(n * k), 52);
  Owned xt = Put(*cuda_, DType::kF32, n, k, x.data());
  Owned ya = Put(*cuda_, DType::kF32, n, 64, nullptr);
  Owned wrong = Put(*cuda_, DType::kF32, n, 63, nullptr);  // one column short
  const std::vector<uint8_t> orders(n, kRowOrderGemv);
  const Tensor* ws[] = {&a.t, &b.t};
  Tensor* ys[] = {&ya.t, &wrong.t};
  absl::Status st = cuda_->MatMulGroup(ws, xt.t, ys, orders);
  EXPECT_THAT(st, StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(st.message(), ::testing::HasSubstr("shape mismatch"));
  Tensor* one[] = {&ya.t};
  EXPECT_THAT(cuda_->MatMulGroup(ws, xt.t, one, orders),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

// The GEMV loads activations 16 bytes at a time when x is 16-byte aligned and one float at a time
// otherwise (a view that starts mid-vector); both add the same products in the same order.
TEST_F(CudaBackendTest, GemvGivesTheSameBitsForUnalignedActivations) {
  const int64_t k = 2048, n = 3, m = 96;
  const std::vector<float> x = RandomFloats(static_cast<size_t>(n * k), 44);
  std::vector<float> shifted(x.size() + 1);
  std::copy(x.begin(), x.end(), shifted.begin() + 1);
  Owned xt = Put(*cuda_, DType::kF32, n, k, x.data());
  Owned xs = Put(*cuda_, DType::kF32, 1, n * k + 1, shifted.data());
  Tensor unaligned = xt.t;
  unaligned.data = static_cast<float*>(xs.t.data) + 1;
  for (DType type : {DType::kQ8_0, DType::kQ4_0, DType::kQ5_0, DType::kQ2_K, DType::kQ3_K,
                     DType::kQ4_K, DType::kQ5_K, DType::kQ6_K}) {
    const std::vector<uint8_t> w = RandomWeights(type, m, k, 45);
    Owned wt = MapW(*cuda_, type, m, k, w.data());
    Owned ya = Put(*cuda_, DType::kF32, n, m, nullptr),
          yu = Put(*cuda_, DType::kF32, n, m, nullptr);
    PD_ASSERT_OK(cuda_->MatMul(wt.t, xt.t, ya.t));
    PD_ASSERT_OK(cuda_->MatMul(wt.t, unaligned, yu.t));
    EXPECT_EQ(Get(*cuda_, yu.t), Get(*cuda_, ya.t)) << Traits(type).name;
  }
}

TEST_F(CudaBackendTest, MatMulNamesWeightTypesItLacks) {
  Owned x = Put(*cuda_, DType::kF32, 2, 256, nullptr);
  Owned out = Put(*cuda_, DType::kF32, 2, 4, nullptr);
  for (DType t : {DType::kW8A8, DType::kW4A16}) {
    Owned w = Put(*cuda_, t, 4, 256, nullptr);
    EXPECT_THAT(cuda_->MatMul(w.t, x.t, out.t),
                StatusIs(absl::StatusCode::kUnimplemented, std::string(Traits(t).name)));
  }
  PD_EXPECT_OK(cuda_->Synchronize());
}

// ---- elementwise ops and Softmax ---------------------------------------------------------------
// Add, AddBias and Scale are one F32 operation per element on both sides: bit-exact.
// SwiGlu: g / (1 + exp(-g)) * u, both sides one expf (CUDA's within 2 ulp, ggml's vector expf
//   within 1.5) and three correctly rounded operations: |gpu - cpu| <= 8 ulp, i.e.
//   1e-6 |cpu| + 1e-37 (for results near zero).
// GeGlu: both sides round the gate to f16, evaluate the same F32 formula (tanhf within 2 ulp of
//   glibc's tanh) and round to f16: equal unless the F32 values straddle an f16 rounding boundary,
//   then one f16 ulp apart: |gpu - cpu| <= (2^-10 |gelu| + 2^-24) |u| + 1 F32 ulp, and such
//   mismatches are rare (at most 1 in 1000 elements, expected about 1 in 2^12).
// Softmax: exp(x - max) within 2 ulp per side, the sum in F64 on both, the F32 reciprocal and one
//   product: |gpu - cpu| <= 1e-6 |cpu| + 1e-30.

// Runs `op` on both backends over fresh copies of `inputs` ([rows, cols] each) and returns each
// backend's output (the last tensor `op` is given).
template <typename Op>
void RunBoth(Backend& cpu, Backend& cuda, int64_t rows, int64_t cols,
             const std::vector<std::vector<float>>& inputs, Op op, std::vector<float>* out_cpu,
             std::vector<float>* out_cuda) {
  Backend* backends[2] = {&cpu, &cuda};
  std::vector<float>* outs[2] = {out_cpu, out_cuda};
  const std::vector<float> nans(static_cast<size_t>(rows * cols),
                                std::numeric_limits<float>::quiet_NaN());
  for (int b = 0; b < 2; ++b) {
    std::vector<Owned> ins;
    for (const std::vector<float>& in : inputs) {
      ins.push_back(Put(*backends[b], DType::kF32, rows, cols, in.data()));
    }
    Owned y = Put(*backends[b], DType::kF32, rows, cols, nans.data());
    PD_CHECK_OK(op(*backends[b], ins, y.t));
    *outs[b] = Get(*backends[b], y.t);
  }
}

struct EltShape {
  int64_t rows, cols;
};

class CudaElementwiseTest : public CudaBackendTest,
                            public ::testing::WithParamInterface<EltShape> {};

TEST_P(CudaElementwiseTest, ExactOpsMatchCpuBitForBit) {
  const EltShape c = GetParam();
  const size_t n = static_cast<size_t>(c.rows * c.cols);
  const std::vector<float> a = RandomFloats(n, 51, -4.f, 4.f), b = RandomFloats(n, 52, -4.f, 4.f);
  const std::vector<float> bias = RandomFloats(static_cast<size_t>(c.cols), 53);
  std::vector<float> cpu, gpu;
  RunBoth(
      *cpu_, *cuda_, c.rows, c.cols, {a, b},
      [](Backend& be, std::vector<Owned>& in, Tensor& y) { return be.Add(in[0].t, in[1].t, y); },
      &cpu, &gpu);
  EXPECT_EQ(gpu, cpu) << "Add";
  RunBoth(
      *cpu_, *cuda_, c.rows, c.cols, {a},
      [](Backend& be, std::vector<Owned>& in, Tensor& y) {
        return be.Scale(in[0].t, 0.0625f * 3, y);
      },
      &cpu, &gpu);
  EXPECT_EQ(gpu, cpu) << "Scale";
  // Softcap: CUDA's tanhf is within 2 ulp of libm's (CUDA C Programming Guide, Mathematical
  // Functions); with the final product rounded, 3 ulp of cap.
  const std::vector<float> big = RandomFloats(n, 54, -80.f, 80.f);
  RunBoth(
      *cpu_, *cuda_, c.rows, c.cols, {big},
      [](Backend& be, std::vector<Owned>& in, Tensor& y) { return be.Softcap(in[0].t, 30.f, y); },
      &cpu, &gpu);
  for (size_t i = 0; i < n; ++i) {
    ASSERT_NEAR(gpu[i], cpu[i], 3 * 30.f * std::numeric_limits<float>::epsilon()) << i;
  }
  for (int b2 = 0; b2 < 2; ++b2) {
    Backend& be = b2 == 0 ? *cpu_ : *cuda_;
    Owned x = Put(be, DType::kF32, c.rows, c.cols, a.data());
    Owned bt = Put(be, DType::kF32, 1, c.cols, bias.data());
    PD_ASSERT_OK(be.AddBias(x.t, bt.t, x.t));  // in place, as Model adds Q/K/V biases
    (b2 == 0 ? cpu : gpu) = Get(be, x.t);
  }
  EXPECT_EQ(gpu, cpu) << "AddBias";
}

// MoeCombine: separately rounded products and sums in slot order on both sides: bit for bit.
TEST_P(CudaElementwiseTest, MoeCombineMatchesCpuBitForBit) {
  const EltShape c = GetParam();
  const int k = 4;
  const int64_t m = c.rows * 2 + 1;
  const std::vector<float> rv = RandomFloats(static_cast<size_t>(m * c.cols), 71, -4.f, 4.f);
  std::vector<int32_t> index(static_cast<size_t>(c.rows * k));
  std::vector<float> weights = RandomFloats(index.size(), 72, 0.f, 1.f);
  for (size_t i = 0; i < index.size(); ++i) index[i] = static_cast<int32_t>((i * 5 + 1) % m);
  std::vector<float> out[2];
  for (int b2 = 0; b2 < 2; ++b2) {
    Backend& be = b2 == 0 ? *cpu_ : *cuda_;
    Owned rows = Put(be, DType::kF32, m, c.cols, rv.data());
    const std::vector<float> zeros(static_cast<size_t>(c.rows * c.cols), 0.f);
    Owned y = Put(be, DType::kF32, c.rows, c.cols, zeros.data());
    PD_ASSERT_OK(be.MoeCombine(rows.t, index, weights, k, y.t));
    out[b2] = Get(be, y.t);
  }
  EXPECT_EQ(out[1], out[0]) << "MoeCombine";
}

TEST_P(CudaElementwiseTest, SwiGluAndGeGluMatchCpu) {
  const EltShape c = GetParam();
  const size_t n = static_cast<size_t>(c.rows * c.cols);
  // Gates over GeGlu's whole range, both clamps included.
  std::vector<float> g = RandomFloats(n, 61, -12.f, 12.f);
  if (n >= 3) {
    g[0] = -10.f;
    g[1] = 10.f;
    g[2] = 0.f;
  }
  const std::vector<float> up = RandomFloats(n, 62, -2.f, 2.f);
  std::vector<float> cpu, gpu;
  RunBoth(
      *cpu_, *cuda_, c.rows, c.cols, {g, up},
      [](Backend& be, std::vector<Owned>& in, Tensor& y) { return be.SwiGlu(in[0].t, in[1].t, y); },
      &cpu, &gpu);
  int failures = 0;
  for (size_t i = 0; i < n; ++i) {
    const double tol = 1e-6 * std::fabs(cpu[i]) + 1e-37;
    if (!(std::fabs(double{gpu[i]} - cpu[i]) <= tol) && ++failures <= 10) {
      ADD_FAILURE() << "SwiGlu y[" << i << "] g=" << g[i] << ": cuda " << gpu[i] << " vs cpu "
                    << cpu[i];
    }
  }
  RunBoth(
      *cpu_, *cuda_, c.rows, c.cols, {g, up},
      [](Backend& be, std::vector<Owned>& in, Tensor& y) { return be.GeGlu(in[0].t, in[1].t, y); },
      &cpu, &gpu);
  size_t inexact = 0;
  for (size_t i = 0; i < n; ++i) {
    if (gpu[i] == cpu[i]) continue;
    ++inexact;
    const double gelu = up[i] != 0.f ? std::fabs(double{cpu[i]} / up[i]) : 0.0;
    const double tol =
        (gelu / 1024 + 1.0 / (1 << 24)) * std::fabs(up[i]) + std::fabs(double{cpu[i]}) * 1.2e-7;
    if (!(std::fabs(double{gpu[i]} - cpu[i]) <= tol) && ++failures <= 10) {
      ADD_FAILURE() << "GeGlu y[" << i << "] g=" << g[i] << ": cuda " << gpu[i] << " vs cpu "
                    << cpu[i];
    }
  }
  EXPECT_LE(inexact, n / 1000 + 1) << "GeGlu: too many elements one f16 ulp apart";
  EXPECT_EQ(failures, 0);
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaElementwiseTest,
                         ::testing::Values(EltShape{1, 1}, EltShape{7, 2048},     // Gemma's n_ff
                                           EltShape{1, 640}, EltShape{3, 14336},  // Llama 3's
                                           EltShape{64, 11008}),                  // Llama 2's
                         [](const ::testing::TestParamInfo<EltShape>& info) {
                           return "r" + std::to_string(info.param.rows) + "_c" +
                                  std::to_string(info.param.cols);
                         });

TEST_F(CudaBackendTest, SoftmaxMatchesCpu) {
  // Attention-score rows, a masked row, and vocabulary rows (Gemma 3's 262144, as logits are
  // sampled from).
  for (const EltShape c :
       {EltShape{5, 37}, EltShape{3, 300}, EltShape{2, 4096}, EltShape{2, 262144}}) {
    SCOPED_TRACE(c.cols);
    std::vector<float> x = RandomFloats(static_cast<size_t>(c.rows * c.cols), 71, -20.f, 20.f);
    for (int64_t j = 0; j < c.cols; ++j) x[j] = -std::numeric_limits<float>::infinity();
    x[c.cols + 1] = -std::numeric_limits<float>::infinity();  // one masked element
    std::vector<float> results[2];
    Backend* backends[2] = {cpu_.get(), cuda_.get()};
    for (int b = 0; b < 2; ++b) {
      Owned t = Put(*backends[b], DType::kF32, c.rows, c.cols, x.data());
      PD_ASSERT_OK(backends[b]->Softmax(t.t));
      results[b] = Get(*backends[b], t.t);
    }
    int failures = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      const float cpu = results[0][i], gpu = results[1][i];
      const double tol = 1e-6 * std::fabs(cpu) + 1e-30;
      if (!(std::fabs(double{gpu} - cpu) <= tol) && ++failures <= 10) {
        ADD_FAILURE() << "x[" << i / c.cols << ", " << i % c.cols << "]: cuda " << gpu << " vs cpu "
                      << cpu;
      }
    }
    EXPECT_EQ(failures, 0);
  }
}

// ---- Rope parity --------------------------------------------------------------------------------
// Both sides build the same angles bit for bit (the same chain of F32 products, the same division
// and scale). Their cosines and sines differ by at most 3 ulp (sincosf within 2, glibc within 1),
// |delta c|, |delta s| <= 3 * 2^-24, and the CPU leaves some normal-mode pairs unfused where the
// GPU fuses them (one rounding of |a c| + |b s|), so per output of a pair (a, b):
// |gpu - cpu| <= 1e-6 (|a| + |b|) + 1e-30.

struct RopeCase {
  const char* name;
  RopeMode mode;
  int n_heads, head_dim, rot_dim;
  float freq_base, freq_scale;
  bool freq_factors;
};

class CudaRopeTest : public CudaBackendTest, public ::testing::WithParamInterface<RopeCase> {};

TEST_P(CudaRopeTest, MatchesCpu) {
  const RopeCase c = GetParam();
  const int64_t n_tokens = 9, cols = int64_t{c.n_heads} * c.head_dim;
  const std::vector<float> x = RandomFloats(static_cast<size_t>(n_tokens * cols), 81, -3.f, 3.f);
  std::vector<int32_t> pos = {0, 1, 2, 511, 512, 4095, 8191, 32767, 131071};
  std::vector<float> factors;
  if (c.freq_factors) factors = RandomFloats(static_cast<size_t>(c.rot_dim / 2), 82, 1.f, 8.f);
  RopeParams p;
  p.mode = c.mode;
  p.head_dim = c.head_dim;
  p.rot_dim = c.rot_dim;
  p.freq_base = c.freq_base;
  p.freq_scale = c.freq_scale;
  p.freq_factors = factors;
  std::vector<float> results[2];
  Backend* backends[2] = {cpu_.get(), cuda_.get()};
  for (int b = 0; b < 2; ++b) {
    Owned t = Put(*backends[b], DType::kF32, n_tokens, cols, x.data());
    PD_ASSERT_OK(backends[b]->Rope(t.t, c.n_heads, pos, p));
    results[b] = Get(*backends[b], t.t);
  }
  const int half = c.rot_dim / 2;
  int failures = 0;
  for (int64_t t = 0; t < n_tokens; ++t) {
    for (int h = 0; h < c.n_heads; ++h) {
      const int64_t base = t * cols + int64_t{h} * c.head_dim;
      for (int d = 0; d < c.head_dim; ++d) {
        // The pair element d belongs to; elements past rot_dim must be untouched.
        int partner = d;
        if (d < c.rot_dim) {
          partner = c.mode == RopeMode::kNeox ? (d < half ? d + half : d - half) : (d ^ 1);
        }
        const double scale = std::fabs(double{x[base + d]}) + std::fabs(double{x[base + partner]});
        const double tol = d < c.rot_dim ? 1e-6 * scale + 1e-30 : 0.0;
        const float cpu = results[0][base + d], gpu = results[1][base + d];
        if (!(std::fabs(double{gpu} - cpu) <= tol) && ++failures <= 10) {
          ADD_FAILURE() << "token " << t << " (pos " << pos[t] << ") head " << h << " dim " << d
                        << ": cuda " << gpu << " vs cpu " << cpu;
        }
      }
    }
  }
  EXPECT_EQ(failures, 0);
}

INSTANTIATE_TEST_SUITE_P(
    Models, CudaRopeTest,
    ::testing::Values(
        RopeCase{"gemma3_q", RopeMode::kNeox, 4, 256, 256, 1000000.f, 1.f, false},
        RopeCase{"gemma3_local_k", RopeMode::kNeox, 1, 256, 256, 10000.f, 1.f, false},
        RopeCase{"llama7b_q", RopeMode::kNormal, 32, 128, 128, 10000.f, 1.f, false},
        RopeCase{"llama3_k_factors", RopeMode::kNormal, 8, 128, 128, 500000.f, 1.f, true},
        RopeCase{"partial_scaled", RopeMode::kNeox, 4, 128, 64, 10000.f, 0.25f, false},
        RopeCase{"partial_normal", RopeMode::kNormal, 2, 80, 32, 10000.f, 0.5f, true}),
    [](const ::testing::TestParamInfo<RopeCase>& info) { return std::string(info.param.name); });

// ---- StoreKv and Attention parity --------------------------------------------------------------
//
// StoreKv is bit-exact for every cache type: F32 copies, F16 rounds to nearest even on both
// sides, INT8 runs the same butterflies (each output one F32 addition of the same inputs), the
// same max, the same IEEE division and the same round-half-even.
//
// Attention reads the same cache bytes on both sides. Per token t and head, over its L visible
// positions, with u = 2^-24, D = head_dim: a score q.k is a D-term F32 sum in another order,
// off by at most (D + 8) u ||q|| ||k|| (Cauchy-Schwarz bounds sum |q_i k_i| in any rotated
// basis too), times |scale| (a softcap's tanh shrinks that and adds 4 u softcap). The
// probabilities then move by at most twice that relative (numerator and normalizer), plus a few
// ulp of expf, plus the GPU's online F32 sum of L terms ((L + 16) u). So
//   |gpu - cpu| <= V (2 ds + (2 L + 48) u) + 1e-7,
// ds the score bound and V the largest |v| in F32 / F16 caches; in an INT8 cache the sum is taken
// in the rotated basis and rotated back, which can gather the errors of a whole rotation block:
// there V is the largest ||v|| (2-norm of a head).

struct KvSeq {
  int32_t len;                  // positions 0 .. len - 1 stored
  std::vector<int32_t> blocks;  // block table
};

// Fills `cache_k`/`cache_v` of one backend with the same history: each sequence's positions, in
// one StoreKv call per sequence. K and V rows are k[s][p], v[s][p] ([n_kv_heads * head_dim]).
absl::Status StoreHistory(Backend& be, KvTensor& kc, KvTensor& vc, const std::vector<KvSeq>& seqs,
                          const std::vector<std::vector<float>>& k,
                          const std::vector<std::vector<float>>& v, int block_size) {
  const int64_t row = kc.row_elems();
  std::vector<absl::Span<const int32_t>> tables;
  for (const KvSeq& s : seqs) tables.emplace_back(s.blocks);
  for (size_t s = 0; s < seqs.size(); ++s) {
    const int32_t n = seqs[s].len;
    std::vector<int32_t> pos(n), seq(n, static_cast<int32_t>(s));
    for (int32_t p = 0; p < n; ++p) pos[p] = p;
    Owned kt = Put(be, DType::kF32, n, row, k[s].data());
    Owned vt = Put(be, DType::kF32, n, row, v[s].data());
    KvBatch b{pos, seq, tables, block_size, {}};
    PD_RETURN_IF_ERROR(be.StoreKv(kt.t, vt.t, kc, vc, b));
  }
  return be.Synchronize();
}

struct AttnCase {
  const char* name;
  KvDType type;
  int n_heads, n_kv_heads, head_dim, block_size;
  int window;
  float softcap;
};

// The prompt rows of a batch: which rows CudaBackend::Attention gives the tiled kernel
// (attention.cuh). Runs of at least kTiledAttentionMinRun rows, consecutive in the batch, at
// consecutive positions of one sequence, when the kernel takes the head size (the caches here
// come from Allocate, so aligned, and the GPUs we run on have compute capability 8.0 or more).
std::vector<bool> TiledRows(const std::vector<int32_t>& pos, const std::vector<int32_t>& seq,
                            int head_dim) {
  std::vector<bool> tiled(pos.size(), false);
  if (head_dim % 16 != 0 || head_dim > cuda::kMaxTiledAttentionHeadDim) return tiled;
  for (size_t t = 0; t < pos.size();) {
    size_t run = 1;
    while (t + run < pos.size() && seq[t + run] == seq[t] &&
           pos[t + run] == pos[t] + static_cast<int32_t>(run)) {
      ++run;
    }
    if (run >= static_cast<size_t>(cuda::kTiledAttentionMinRun)) {
      std::fill(tiled.begin() + static_cast<std::ptrdiff_t>(t),
                tiled.begin() + static_cast<std::ptrdiff_t>(t + run), true);
    }
    t += run;
  }
  return tiled;
}

// The tiled kernel's bound (prompt rows; the per-row kernel's is derived above). It rounds to
// F16, unit roundoff e = 2^-11 (2^-25 absolute below 2^-14, in F16's subnormals), with u = 2^-24
// and D = head_dim as above:
//   - the query, once: q_i moves by e |q_i| + 2^-25, a score by |scale| (e sum |q_i k_i| +
//     2^-25 sum |k_i|) <= |scale| (e ||q|| ||k|| + 2^-25 sqrt(D) ||k||). INT8 rotates q first and
//     sums in the stored basis, where sum |q'_i k'_i| <= ||q'|| ||k'|| = ||q|| ||k|| with k the
//     dequantized key: ||k|| <= its F32 norm + sqrt(b D) s / 2 (s = the key's scale, max |H k / b|
//     / 127; b the rotation block).
//   - F32 caches' keys, as loaded: e_k = e, the same with q and k swapped. F16 keys are exact;
//     INT8 keys enter as their codes (exact in F16) with the scale applied to the F32 score.
//   - the tensor cores' F32 sum of the D products, which may truncate rather than round: 2 (D + 8)
//     u on top of the CPU's (D + 8) u.
// So ds = |scale| (||q|| ||k|| (e + e_k + 3 (D + 8) u) + 2^-25 sqrt(D) (||q|| + ||k||)) + 4 u
// softcap, and the softmax weights move by at most a factor e^(+-2 ds): V_w (e^(2 ds) - 1). Then:
//   - P rounded to F16 before P V, while l sums the unrounded P: sum |p~ - p| |v| / l <= (e +
//     L 2^-25) V_w, since l >= 1 (the largest score's own term is exp(0));
//   - F32 and INT8 values rounded to F16 as loaded (INT8: code * scale), e_v = e: e_v V_r, plus
//     2^-25 absolute per value below 2^-14 (b of them gathered by INT8's rotation back);
//   - the F32 sums of the L products and of l, the rescaling per tile of 64 keys, and the CPU's
//     own sums: (4 L + 64) u V_r.
// V_w bounds |v_d| (INT8: of the dequantized value, |v_d| + b s / 2; weight errors are sums of
// whole value rows, the same in either basis) and V_r is V_w for F32 / F16 but the largest ||v||
// (+ sqrt(b D) s / 2) for INT8, whose per-element errors in the rotated basis can gather a whole
// rotation block when rotated back:
//   |gpu - cpu| <= V_w (1 + e_v) (e^(2 ds) - 1 + e + L 2^-25) + V_r (e_v + (4 L + 64) u)
//                  + [e_v] b' 2^-25 + 1e-7            (b' = b for INT8, 1 for F32).
// That is some 0.3% of max |v| for the shapes below, yet an off-by-one in a mask still shows: it
// moves a row over L keys by about |v| / L, and the cases run windows of 24 positions and rows
// that see 1, 2, 3 ... keys (a host emulation of the kernel with the window's first position off
// by one exceeds this bound 14-fold).
double AttentionTolerance(const AttnCase& c, const AttentionParams& p, const float* qh,
                          const std::vector<float>& k, const std::vector<float>& v, int kvh,
                          int64_t lo, int64_t hi, bool tiled) {
  constexpr double u = 1.0 / (1 << 24), e = 1.0 / (1 << 11), sub = 1.0 / (1 << 25);
  const int64_t row = int64_t{c.n_kv_heads} * c.head_dim, L = hi - lo + 1;
  const int b = KvRotationBlock(c.head_dim);
  const bool i8 = c.type == KvDType::kI8;
  double qn = 0;
  for (int d = 0; d < c.head_dim; ++d) qn += double{qh[d]} * qh[d];
  qn = std::sqrt(qn);
  // Over the visible rows: the largest ||k||, max |v_d| and ||v||, and (INT8) the dequantization
  // allowances of the tiled bound.
  double kn = 0, v_max = 0, vn = 0, kn_q = 0, v_max_q = 0, vn_q = 0;
  std::vector<float> rotated(static_cast<size_t>(c.head_dim));
  for (int64_t pp = lo; pp <= hi; ++pp) {
    for (int kv = 0; kv < 2; ++kv) {
      const float* x = (kv == 0 ? k : v).data() + pp * row + int64_t{kvh} * c.head_dim;
      double norm = 0, amax = 0;
      for (int d = 0; d < c.head_dim; ++d) {
        norm += double{x[d]} * x[d];
        amax = std::max(amax, std::fabs(double{x[d]}));
      }
      norm = std::sqrt(norm);
      double s = 0;  // the INT8 scale StoreKv gives the row
      if (i8) {
        rotated.assign(x, x + c.head_dim);
        RotateKvRowIn(rotated.data(), c.head_dim);
        for (float f : rotated) s = std::max(s, std::fabs(double{f}) / 127);
      }
      const double norm_q = norm + std::sqrt(static_cast<double>(b) * c.head_dim) * s / 2;
      if (kv == 0) {
        kn = std::max(kn, norm);
        kn_q = std::max(kn_q, norm_q);
      } else {
        v_max = std::max(v_max, amax);
        vn = std::max(vn, norm);
        v_max_q = std::max(v_max_q, amax + b * s / 2);
        vn_q = std::max(vn_q, norm_q);
      }
    }
  }
  if (!tiled) {
    const double ds = (c.head_dim + 8) * u * qn * kn * p.scale + 4 * u * c.softcap;
    const double vb = i8 ? vn : v_max;
    return vb * (2 * ds + (2.0 * L + 48) * u) + 1e-7;
  }
  const double e_k = c.type == KvDType::kF32 ? e : 0, e_v = c.type == KvDType::kF16 ? 0 : e;
  const double k_b = i8 ? kn_q : kn;
  const double v_w = i8 ? v_max_q : v_max, v_r = i8 ? vn_q : v_max;
  const double ds = p.scale * (qn * k_b * (e + e_k + 3 * (c.head_dim + 8) * u) +
                               sub * std::sqrt(static_cast<double>(c.head_dim)) * (qn + k_b)) +
                    4 * u * c.softcap;
  return v_w * (1 + e_v) * (std::expm1(2 * ds) + e + L * sub) + v_r * (e_v + (4.0 * L + 64) * u) +
         (e_v > 0 ? (i8 ? b : 1) * sub : 0) + 1e-7;
}

class CudaAttentionTest : public CudaBackendTest, public ::testing::WithParamInterface<AttnCase> {};

TEST_P(CudaAttentionTest, StoreKvIsBitExactAndAttentionMatchesCpu) {
  const AttnCase c = GetParam();
  const int bs = c.block_size;
  const int64_t row = int64_t{c.n_kv_heads} * c.head_dim;
  // Three sequences with scattered, interleaved blocks: a prompt being prefilled (40 positions),
  // a decode at position 700 and one at 2000 (past Gemma's 512-position window).
  std::vector<KvSeq> seqs = {{40, {}}, {701, {}}, {2001, {}}};
  int32_t next_block = 3;
  for (KvSeq& s : seqs) {
    // Multiplying by 7 modulo the prime 1009 permutes the block ids: distinct, out of order.
    for (int32_t b = 0; b * bs < s.len; ++b) s.blocks.push_back(next_block++ * 7 % 1009);
  }
  const int64_t n_blocks = 1009;
  std::vector<std::vector<float>> k, v;
  for (size_t s = 0; s < seqs.size(); ++s) {
    k.push_back(
        RandomFloats(static_cast<size_t>(seqs[s].len * row), 91 + static_cast<uint32_t>(s)));
    v.push_back(
        RandomFloats(static_cast<size_t>(seqs[s].len * row), 95 + static_cast<uint32_t>(s)));
  }
  KvTensor caches[2][2];
  std::unique_ptr<Buffer> bufs[2][2];
  Backend* backends[2] = {cpu_.get(), cuda_.get()};
  for (int b = 0; b < 2; ++b) {
    for (int kv = 0; kv < 2; ++kv) {
      KvTensor& t = caches[b][kv];
      t = KvTensor{c.type, c.n_kv_heads, c.head_dim, bs, n_blocks, nullptr};
      absl::StatusOr<std::unique_ptr<Buffer>> buf = backends[b]->Allocate(t.bytes());
      PD_ASSERT_OK(buf.status());
      bufs[b][kv] = *std::move(buf);
      t.data = bufs[b][kv]->data();
      // The same bytes everywhere first, so that untouched slots compare equal too.
      const std::vector<uint8_t> fill(t.bytes(), 0x3C);
      PD_ASSERT_OK(backends[b]->Upload(t.data, fill.data(), fill.size()));
    }
    PD_ASSERT_OK(StoreHistory(*backends[b], caches[b][0], caches[b][1], seqs, k, v, bs));
  }
  for (int kv = 0; kv < 2; ++kv) {
    std::vector<uint8_t> bytes[2];
    for (int b = 0; b < 2; ++b) {
      bytes[b].resize(caches[b][kv].bytes());
      PD_ASSERT_OK(backends[b]->Download(bytes[b].data(), caches[b][kv].data, bytes[b].size()));
      PD_ASSERT_OK(backends[b]->Synchronize());
    }
    ASSERT_TRUE(bytes[0] == bytes[1]) << (kv == 0 ? "K" : "V") << " cache bytes differ";
  }

  // Two batches: a mixed one (the prompt's last 9 rows, causal among themselves, plus both
  // decodes) and a decode-only one, which splits each head's positions over several blocks.
  std::vector<absl::Span<const int32_t>> tables;
  for (const KvSeq& s : seqs) tables.emplace_back(s.blocks);
  const std::vector<int32_t> mixed_pos = {31, 32, 33, 34, 35, 36, 37, 38, 39, 700, 2000};
  const std::vector<int32_t> mixed_seq = {0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 2};
  const std::vector<int32_t> decode_pos = {700, 2000}, decode_seq = {1, 2};
  AttentionParams p{c.n_heads,  c.n_kv_heads,
                    c.head_dim, 1.f / std::sqrt(static_cast<float>(c.head_dim)),
                    c.window,   c.softcap};
  for (int batch = 0; batch < 2; ++batch) {
    const std::vector<int32_t>& pos = batch == 0 ? mixed_pos : decode_pos;
    const std::vector<int32_t>& seq = batch == 0 ? mixed_seq : decode_seq;
    SCOPED_TRACE(batch == 0 ? "mixed batch" : "decode batch");
    const int64_t n = static_cast<int64_t>(pos.size()), cols = int64_t{c.n_heads} * c.head_dim;
    const std::vector<float> q = RandomFloats(static_cast<size_t>(n * cols), 99);
    KvBatch kvb{pos, seq, tables, bs, {}};
    std::vector<float> results[2];
    for (int b = 0; b < 2; ++b) {
      Owned qt = Put(*backends[b], DType::kF32, n, cols, q.data());
      // In place (out == q), as Model runs it.
      PD_ASSERT_OK(backends[b]->Attention(qt.t, caches[b][0], caches[b][1], kvb, p, qt.t))
          << backends[b]->name();
      results[b] = Get(*backends[b], qt.t);
    }
    // Both batches' rows take the per-row kernel (the prompt's run of 9 is below
    // kTiledAttentionMinRun), but the bound follows the kernel either way.
    const std::vector<bool> tiled = TiledRows(pos, seq, c.head_dim);
    const int group = c.n_heads / c.n_kv_heads;
    int failures = 0;
    for (int64_t t = 0; t < n; ++t) {
      const int64_t lo = c.window > 0 ? std::max(0, pos[t] - c.window + 1) : 0;
      for (int h = 0; h < c.n_heads; ++h) {
        const float* qh = q.data() + t * cols + int64_t{h} * c.head_dim;
        const double tol =
            AttentionTolerance(c, p, qh, k[seq[t]], v[seq[t]], h / group, lo, pos[t], tiled[t]);
        for (int d = 0; d < c.head_dim; ++d) {
          const int64_t i = t * cols + int64_t{h} * c.head_dim + d;
          if (!(std::fabs(double{results[1][i]} - results[0][i]) <= tol) && ++failures <= 10) {
            ADD_FAILURE() << "token " << t << " (pos " << pos[t] << ") head " << h << " dim " << d
                          << ": cuda " << results[1][i] << " vs cpu " << results[0][i]
                          << " (tolerance " << tol << ")";
          }
        }
      }
    }
    EXPECT_EQ(failures, 0);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Models, CudaAttentionTest,
    ::testing::Values(
        // Gemma 3 270M: 4 heads on 1 KV head of 256; local layers see 512 positions.
        AttnCase{"gemma3_f32", KvDType::kF32, 4, 1, 256, 16, 0, 0.f},
        AttnCase{"gemma3_f16_local", KvDType::kF16, 4, 1, 256, 16, 512, 0.f},
        AttnCase{"gemma3_int8", KvDType::kI8, 4, 1, 256, 16, 0, 0.f},
        AttnCase{"gemma3_int8_local", KvDType::kI8, 4, 1, 256, 16, 512, 0.f},
        // Llama 7B-style GQA (Llama 3 8B / Mistral: 32 heads on 8 KV heads of 128).
        AttnCase{"llama_gqa_f16", KvDType::kF16, 32, 8, 128, 16, 0, 0.f},
        AttnCase{"llama_gqa_f32", KvDType::kF32, 32, 8, 128, 32, 0, 0.f},
        AttnCase{"llama_gqa_int8", KvDType::kI8, 32, 8, 128, 16, 0, 0.f},
        // Gemma 2's logit softcap; an odd block size and a head of 80 (rotation blocks of 16).
        AttnCase{"softcap_f16", KvDType::kF16, 8, 4, 128, 16, 0, 50.f},
        AttnCase{"odd_blocks_int8", KvDType::kI8, 6, 2, 80, 7, 100, 30.f},
        AttnCase{"odd_blocks_f16", KvDType::kF16, 6, 2, 80, 7, 0, 0.f}),
    [](const ::testing::TestParamInfo<AttnCase>& info) { return std::string(info.param.name); });

// Prompt-shaped batches, whose runs of rows take the tiled kernel: six sequences, their rows in
// the batch (in this order)
//   - a decode at position 700;
//   - sequence 0's prompt, positions 0 .. 139 (rows that see 1, 2, 3 ... keys);
//   - a decode at position 2000 (past every window);
//   - the rest of sequence 0's prompt, 140 .. 299, a run of its own;
//   - a later chunk of sequence 1, positions 100 .. 116: 17 rows, a partial tile at its end;
//   - sequence 3's whole prompt of 41 rows;
//   - 5 rows 60 .. 64 of sequence 4, a run too short for the tiled kernel (speculative decoding's
//     shape),
// against the CPU, each row with its kernel's bound (AttentionTolerance). Block tables are
// scattered as in CudaAttentionTest. The cases cover GQA groups of 1 to 72 query heads per KV
// head (a tile's 64 rows are (row, head) pairs: 64 rows of one head, 16 of 4, 12 of 5, 4 of 16,
// one row of 64 heads and one of 8), head sizes 16 to 256, windows, softcaps, odd block sizes,
// and every cache type.
class CudaPromptAttentionTest : public CudaBackendTest,
                                public ::testing::WithParamInterface<AttnCase> {};

TEST_P(CudaPromptAttentionTest, TiledPromptRowsMatchCpu) {
  const AttnCase c = GetParam();
  const int bs = c.block_size;
  const int64_t row = int64_t{c.n_kv_heads} * c.head_dim;
  std::vector<KvSeq> seqs = {{300, {}}, {117, {}}, {701, {}}, {41, {}}, {65, {}}, {2001, {}}};
  // Block ids 7 i modulo a prime above the number of blocks: distinct and out of order.
  int32_t n_blocks = 3;
  for (const KvSeq& s : seqs) n_blocks += (s.len + bs - 1) / bs;
  auto is_prime = [](int32_t x) {
    for (int32_t d = 2; d * d <= x; ++d) {
      if (x % d == 0) return false;
    }
    return true;
  };
  while (!is_prime(n_blocks)) ++n_blocks;
  int32_t next_block = 3;
  for (KvSeq& s : seqs) {
    for (int32_t b = 0; b * bs < s.len; ++b) s.blocks.push_back(next_block++ * 7 % n_blocks);
  }
  std::vector<std::vector<float>> k, v;
  for (size_t s = 0; s < seqs.size(); ++s) {
    k.push_back(
        RandomFloats(static_cast<size_t>(seqs[s].len * row), 91 + static_cast<uint32_t>(s)));
    v.push_back(
        RandomFloats(static_cast<size_t>(seqs[s].len * row), 95 + static_cast<uint32_t>(s)));
  }
  KvTensor caches[2][2];
  std::unique_ptr<Buffer> bufs[2][2];
  Backend* backends[2] = {cpu_.get(), cuda_.get()};
  for (int b = 0; b < 2; ++b) {
    for (int kv = 0; kv < 2; ++kv) {
      KvTensor& t = caches[b][kv];
      t = KvTensor{c.type, c.n_kv_heads, c.head_dim, bs, n_blocks, nullptr};
      absl::StatusOr<std::unique_ptr<Buffer>> buf = backends[b]->Allocate(t.bytes());
      PD_ASSERT_OK(buf.status());
      bufs[b][kv] = *std::move(buf);
      t.data = bufs[b][kv]->data();
      PD_ASSERT_OK(backends[b]->Zero(t.data, t.bytes()));
    }
    PD_ASSERT_OK(StoreHistory(*backends[b], caches[b][0], caches[b][1], seqs, k, v, bs));
  }

  std::vector<int32_t> pos, seq;
  auto add = [&](int32_t s, int32_t first, int32_t count) {
    for (int32_t i = 0; i < count; ++i) {
      pos.push_back(first + i);
      seq.push_back(s);
    }
  };
  add(2, 700, 1);
  add(0, 0, 140);
  add(5, 2000, 1);
  add(0, 140, 160);
  add(1, 100, 17);
  add(3, 0, 41);
  add(4, 60, 5);
  std::vector<absl::Span<const int32_t>> tables;
  for (const KvSeq& s : seqs) tables.emplace_back(s.blocks);
  const AttentionParams p{c.n_heads,  c.n_kv_heads,
                          c.head_dim, 1.f / std::sqrt(static_cast<float>(c.head_dim)),
                          c.window,   c.softcap};
  const int64_t n = static_cast<int64_t>(pos.size()), cols = int64_t{c.n_heads} * c.head_dim;
  const std::vector<float> q = RandomFloats(static_cast<size_t>(n * cols), 99);
  const KvBatch kvb{pos, seq, tables, bs, {}};
  std::vector<float> results[2];
  for (int b = 0; b < 2; ++b) {
    Owned qt = Put(*backends[b], DType::kF32, n, cols, q.data());
    // In place (out == q), as Model runs it.
    PD_ASSERT_OK(backends[b]->Attention(qt.t, caches[b][0], caches[b][1], kvb, p, qt.t))
        << backends[b]->name();
    results[b] = Get(*backends[b], qt.t);
  }
  const std::vector<bool> tiled = TiledRows(pos, seq, c.head_dim);
  ASSERT_EQ(std::count(tiled.begin(), tiled.end(), true), 300 + 17 + 41)
      << "the prompts' runs should take the tiled kernel";
  const int group = c.n_heads / c.n_kv_heads;
  int failures = 0;
  for (int64_t t = 0; t < n; ++t) {
    const int64_t lo = c.window > 0 ? std::max(0, pos[t] - c.window + 1) : 0;
    for (int h = 0; h < c.n_heads; ++h) {
      const float* qh = q.data() + t * cols + int64_t{h} * c.head_dim;
      const double tol =
          AttentionTolerance(c, p, qh, k[seq[t]], v[seq[t]], h / group, lo, pos[t], tiled[t]);
      for (int d = 0; d < c.head_dim; ++d) {
        const int64_t i = t * cols + int64_t{h} * c.head_dim + d;
        if (!(std::fabs(double{results[1][i]} - results[0][i]) <= tol) && ++failures <= 10) {
          ADD_FAILURE() << "row " << t << " (sequence " << seq[t] << ", pos " << pos[t]
                        << (tiled[t] ? ", tiled" : ", per-row") << ") head " << h << " dim " << d
                        << ": cuda " << results[1][i] << " vs cpu " << results[0][i]
                        << " (tolerance " << tol << ")";
        }
      }
    }
  }
  EXPECT_EQ(failures, 0);
}

INSTANTIATE_TEST_SUITE_P(
    Models, CudaPromptAttentionTest,
    ::testing::Values(
        // Llama 3.2 1B (32 heads on 8 KV heads of 64) and Llama 7B (32 on 32 of 128).
        AttnCase{"llama1b_f16", KvDType::kF16, 32, 8, 64, 16, 0, 0.f},
        AttnCase{"llama7b_f16", KvDType::kF16, 32, 32, 128, 16, 0, 0.f},
        AttnCase{"llama_gqa_f32", KvDType::kF32, 32, 8, 128, 32, 0, 0.f},
        AttnCase{"llama_gqa_int8_window", KvDType::kI8, 32, 8, 128, 16, 24, 0.f},
        // Gemma 3 270M's heads of 256 (4 on 1 KV head).
        AttnCase{"gemma3_f16_window", KvDType::kF16, 4, 1, 256, 16, 100, 0.f},
        AttnCase{"gemma3_int8", KvDType::kI8, 4, 1, 256, 16, 0, 0.f},
        AttnCase{"gemma3_f32_window_softcap", KvDType::kF32, 4, 1, 256, 16, 512, 30.f},
        AttnCase{"softcap_f16", KvDType::kF16, 8, 4, 128, 16, 0, 50.f},
        // Heads of 80 and 96 (the 128 kernel, column tiles skipped), odd block sizes, groups of
        // 3 and 5 (tiles of 63 and 60 rows: padding rows).
        AttnCase{"odd_blocks_int8", KvDType::kI8, 6, 2, 80, 7, 100, 30.f},
        AttnCase{"odd_blocks_f32_window", KvDType::kF32, 6, 2, 80, 5, 24, 0.f},
        AttnCase{"group5_hd96_f16", KvDType::kF16, 10, 2, 96, 16, 0, 0.f},
        // Wide groups: 16 heads per KV head (tiles of 4 rows), and 72 (over two blocks of
        // heads, 64 and 8), with the smallest heads; heads of 32 in INT8 (rotation blocks of 32).
        AttnCase{"group16_f16", KvDType::kF16, 16, 1, 64, 16, 0, 0.f},
        AttnCase{"group72_hd16_f16", KvDType::kF16, 72, 1, 16, 16, 0, 0.f},
        AttnCase{"hd32_int8", KvDType::kI8, 8, 8, 32, 3, 0, 0.f}),
    [](const ::testing::TestParamInfo<AttnCase>& info) { return std::string(info.param.name); });

// INT8 scales sit right after the block's values; with 3 slots of 1 head of 18 values they start
// at byte 54, not 4-byte aligned. StoreKv must still match the CPU's bytes.
TEST_F(CudaBackendTest, StoreKvInt8WithUnalignedScales) {
  const int bs = 3, hd = 18;
  std::vector<KvSeq> seqs = {{7, {4, 0, 2}}};
  std::vector<std::vector<float>> k = {RandomFloats(7 * hd, 101, -5.f, 5.f)};
  std::vector<std::vector<float>> v = {RandomFloats(7 * hd, 102)};
  for (int i = 0; i < hd; ++i) v[0][3 * hd + i] = 0.f;  // an all-zero head: scale 0, codes 0
  std::vector<uint8_t> bytes[2][2];
  Backend* backends[2] = {cpu_.get(), cuda_.get()};
  for (int b = 0; b < 2; ++b) {
    KvTensor kc{KvDType::kI8, 1, hd, bs, 5, nullptr}, vc = kc;
    absl::StatusOr<std::unique_ptr<Buffer>> kb = backends[b]->Allocate(kc.bytes());
    absl::StatusOr<std::unique_ptr<Buffer>> vb = backends[b]->Allocate(vc.bytes());
    PD_ASSERT_OK(kb.status());
    PD_ASSERT_OK(vb.status());
    kc.data = (*kb)->data();
    vc.data = (*vb)->data();
    PD_ASSERT_OK(backends[b]->Zero(kc.data, kc.bytes()));
    PD_ASSERT_OK(backends[b]->Zero(vc.data, vc.bytes()));
    PD_ASSERT_OK(StoreHistory(*backends[b], kc, vc, seqs, k, v, bs));
    for (int kv = 0; kv < 2; ++kv) {
      const KvTensor& t = kv == 0 ? kc : vc;
      bytes[b][kv].resize(t.bytes());
      PD_ASSERT_OK(backends[b]->Download(bytes[b][kv].data(), t.data, t.bytes()));
      PD_ASSERT_OK(backends[b]->Synchronize());
    }
  }
  EXPECT_TRUE(bytes[0][0] == bytes[1][0]) << "K cache bytes differ";
  EXPECT_TRUE(bytes[0][1] == bytes[1][1]) << "V cache bytes differ";
}

TEST_F(CudaBackendTest, KvOpsRejectBadBatchesAndNameWhatTheyLack) {
  Owned q = Put(*cuda_, DType::kF32, 1, 64, nullptr);
  Owned kv = Put(*cuda_, DType::kF32, 1, 64, nullptr);
  Owned out = Put(*cuda_, DType::kF32, 1, 64, nullptr);
  absl::StatusOr<std::unique_ptr<Buffer>> kbuf = cuda_->Allocate(1 << 16);
  absl::StatusOr<std::unique_ptr<Buffer>> vbuf = cuda_->Allocate(1 << 16);
  PD_ASSERT_OK(kbuf.status());
  PD_ASSERT_OK(vbuf.status());
  KvTensor kc{KvDType::kF16, 1, 64, 4, 2, (*kbuf)->data()};
  KvTensor vc{KvDType::kF16, 1, 64, 4, 2, (*vbuf)->data()};
  const std::vector<int32_t> table = {1}, pos = {0}, seq = {0};
  KvBatch b{pos, seq, {table}, 4, {}};
  AttentionParams p{1, 1, 64, 0.125f, 0, 0.f};
  PD_EXPECT_OK(cuda_->StoreKv(kv.t, kv.t, kc, vc, b));
  PD_EXPECT_OK(cuda_->Attention(q.t, kc, vc, b, p, out.t));
  // A block id outside the cache, and a position past the table.
  const std::vector<int32_t> far_table = {2};
  KvBatch far{pos, seq, {far_table}, 4, {}};
  EXPECT_THAT(cuda_->StoreKv(kv.t, kv.t, kc, vc, far),
              StatusIs(absl::StatusCode::kInvalidArgument));
  const std::vector<int32_t> late = {4};
  KvBatch past{late, seq, {table}, 4, {}};
  EXPECT_THAT(cuda_->Attention(q.t, kc, vc, past, p, out.t),
              StatusIs(absl::StatusCode::kInvalidArgument));
  // K and V caches of different types.
  KvTensor v32{KvDType::kF32, 1, 64, 4, 2, (*vbuf)->data()};
  EXPECT_THAT(cuda_->Attention(q.t, kc, v32, b, p, out.t),
              StatusIs(absl::StatusCode::kUnimplemented, "f32 V cache"));
  PD_EXPECT_OK(cuda_->Synchronize());
}

// ---- timing -------------------------------------------------------------------------------------

// Host wall time per op, averaged over `iters` ops enqueued back to back and one Synchronize():
// what the engine loop sees, launch overhead included.
template <typename F>
absl::StatusOr<double> MicrosPerOp(Backend& be, int iters, F&& op) {
  for (int i = 0; i < 3; ++i) PD_RETURN_IF_ERROR(op());
  PD_RETURN_IF_ERROR(be.Synchronize());
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) PD_RETURN_IF_ERROR(op());
  PD_RETURN_IF_ERROR(be.Synchronize());
  const auto t1 = std::chrono::steady_clock::now();
  return std::chrono::duration<double, std::micro>(t1 - t0).count() / iters;
}

// ---- captured steps (CUDA graphs) ---------------------------------------------------------------

// A CUDA backend with PDSERVE_CUDA_GRAPHS=1, the environment restored after.
absl::StatusOr<std::unique_ptr<Backend>> CreateGraphBackend() {
  const char* v = std::getenv("PDSERVE_CUDA_GRAPHS");
  const std::optional<std::string> saved = v ? std::optional<std::string>(v) : std::nullopt;
  setenv("PDSERVE_CUDA_GRAPHS", "1", 1);
  absl::StatusOr<std::unique_ptr<Backend>> b = CreateCudaBackend(0);
  if (saved) {
    setenv("PDSERVE_CUDA_GRAPHS", saved->c_str(), 1);
  } else {
    unsetenv("PDSERVE_CUDA_GRAPHS");
  }
  return b;
}

// The tensors of a small decode-like step on one backend: an embedding lookup, a norm, a grouped
// int8 GEMV (Q4_K and Q6_K), RoPE and an add. Ids and positions reach the device through the
// staging, which a recorded step takes from its arena.
struct StepTensors {
  static constexpr int64_t kVocab = 64, kEmbd = 256, kQ = 256, kK = 128, kRows = 2;
  Owned table, norm, wq, wk, x, h, q, k, sum;
  StepTensors(Backend& b, const std::vector<uint8_t>& table_bytes, const std::vector<float>& norm_w,
              const std::vector<uint8_t>& q_bytes, const std::vector<uint8_t>& k_bytes)
      : table(MapW(b, DType::kQ8_0, kVocab, kEmbd, table_bytes.data())),
        norm(Put(b, DType::kF32, 1, kEmbd, norm_w.data())),
        wq(MapW(b, DType::kQ4_K, kQ, kEmbd, q_bytes.data())),
        wk(MapW(b, DType::kQ6_K, kK, kEmbd, k_bytes.data())),
        x(Put(b, DType::kF32, kRows, kEmbd, nullptr)),
        h(Put(b, DType::kF32, kRows, kEmbd, nullptr)),
        q(Put(b, DType::kF32, kRows, kQ, nullptr)),
        k(Put(b, DType::kF32, kRows, kK, nullptr)),
        sum(Put(b, DType::kF32, kRows, kQ, nullptr)) {}

  absl::Status Run(Backend& b, const std::vector<int32_t>& ids, const std::vector<int32_t>& pos) {
    PD_RETURN_IF_ERROR(b.GetRows(table.t, ids, x.t));
    PD_RETURN_IF_ERROR(b.RmsNorm(x.t, norm.t, 1e-6f, h.t));
    const Tensor* ws[] = {&wq.t, &wk.t};
    Tensor* ys[] = {&q.t, &k.t};
    const std::vector<uint8_t> orders(kRows, kRowOrderGemv);
    PD_RETURN_IF_ERROR(b.MatMulGroup(ws, h.t, ys, orders));
    RopeParams rope;
    rope.mode = RopeMode::kNeox;
    rope.head_dim = 64;
    rope.rot_dim = 64;
    PD_RETURN_IF_ERROR(b.Rope(q.t, 4, pos, rope));
    PD_RETURN_IF_ERROR(b.Rope(k.t, 2, pos, rope));
    return b.Add(q.t, x.t, sum.t);
  }
  std::vector<std::vector<float>> Outputs(Backend& b) {
    return {Get(b, x.t), Get(b, h.t), Get(b, q.t), Get(b, k.t), Get(b, sum.t)};
  }
};

// A recorded step gives the bits of the same ops launched one by one, step after step (the
// executable graph updated in place as ids and positions change); what may not run during a
// recording is refused, and what cannot be recorded abandons it.
TEST_F(CudaBackendTest, CapturedStepsGiveTheBitsOfLaunchedOps) {
  absl::StatusOr<std::unique_ptr<Backend>> made = CreateGraphBackend();
  PD_ASSERT_OK(made.status());
  Backend& g = **made;
  EXPECT_THAT(g.name(), ::testing::HasSubstr("graphs"));
  if (std::getenv("PDSERVE_CUDA_GRAPHS") == nullptr) {
    EXPECT_FALSE(cuda_->BeginCapture(1)) << "graphs are off unless PDSERVE_CUDA_GRAPHS=1";
  }
  const std::vector<uint8_t> table = RandomWeights(DType::kQ8_0, 64, 256, 61);
  const std::vector<float> norm_w = RandomFloats(256, 62, 0.5f, 1.5f);
  const std::vector<uint8_t> wq = RandomWeights(DType::kQ4_K, 256, 256, 63);
  const std::vector<uint8_t> wk = RandomWeights(DType::kQ6_K, 128, 256, 64);
  StepTensors on_graph(g, table, norm_w, wq, wk), launched(*cuda_, table, norm_w, wq, wk);

  EXPECT_FALSE(g.BeginCapture(0));
  EXPECT_FALSE(g.BeginCapture(9)) << "more rows than the GEMV takes";
  const std::vector<std::vector<int32_t>> ids = {{3, 17}, {40, 2}, {63, 0}, {5, 5}};
  const std::vector<std::vector<int32_t>> pos = {{0, 1}, {7, 8}, {100, 3}, {2047, 4}};
  int abandoned = 0;
  for (size_t step = 0; step < ids.size(); ++step) {
    SCOPED_TRACE(::testing::Message() << "step " << step);
    bool ran = false;
    // A first recording may be abandoned while the scratch buffers and the staging arena grow;
    // the step then runs op by op, and the next recording has what it needs.
    for (int attempt = 0; attempt < 2 && !ran; ++attempt) {
      ASSERT_TRUE(g.BeginCapture(StepTensors::kRows));
      const absl::Status st = on_graph.Run(g, ids[step], pos[step]);
      ASSERT_TRUE(st.ok() || st.code() == absl::StatusCode::kAborted) << st;
      absl::StatusOr<bool> ended = g.EndCapture(st.ok());
      PD_ASSERT_OK(ended.status());
      ran = *ended;
      if (!ran) {
        ++abandoned;
        PD_ASSERT_OK(on_graph.Run(g, ids[step], pos[step]));
      }
    }
    ASSERT_TRUE(ran || abandoned > 0);
    PD_ASSERT_OK(launched.Run(*cuda_, ids[step], pos[step]));
    const std::vector<std::vector<float>> got = on_graph.Outputs(g),
                                          want = launched.Outputs(*cuda_);
    for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(got[i], want[i]) << "output " << i;
  }
  EXPECT_LE(abandoned, 2);
  EXPECT_EQ(g.capture_stats().abandoned, abandoned);
  EXPECT_GE(g.capture_stats().launched, static_cast<int64_t>(ids.size()) - abandoned);

  // While recording: no host waits or allocations; cuBLAS (F16 weights) abandons the recording.
  const std::vector<uint16_t> w16 = ToF16(RandomFloats(32 * 256, 65));
  Owned f16 = MapW(g, DType::kF16, 32, 256, w16.data());
  Owned y16 = Put(g, DType::kF32, 1, 32, nullptr);
  ASSERT_TRUE(g.BeginCapture(1));
  std::vector<float> host(4);
  EXPECT_THAT(g.Download(host.data(), on_graph.x.t.data, 16),
              StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(g.Synchronize(), StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(g.Allocate(64).status(), StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(g.MatMul(f16.t, on_graph.h.t.Rows(0, 1), y16.t),
              StatusIs(absl::StatusCode::kAborted));
  absl::StatusOr<bool> ended = g.EndCapture(false);
  PD_ASSERT_OK(ended.status());
  EXPECT_FALSE(*ended);
  EXPECT_EQ(g.capture_stats().abandoned, abandoned + 1);
  PD_EXPECT_OK(g.Synchronize());
  EXPECT_THAT(g.EndCapture(true), StatusIs(absl::StatusCode::kFailedPrecondition));

  // What a recording saves: a step of 300 one-row RmsNorms (a decode step's small kernels),
  // launched op by op, and recorded and launched as one graph (the recording counted in).
  constexpr int kOps = 300;
  const std::vector<float> row = RandomFloats(4096, 66);
  Owned xr = Put(g, DType::kF32, 1, 4096, row.data()), yr = Put(g, DType::kF32, 1, 4096, nullptr);
  Owned wr = Put(g, DType::kF32, 1, 4096, norm_w.data());
  auto small_ops = [&]() -> absl::Status {
    for (int i = 0; i < kOps; ++i) PD_RETURN_IF_ERROR(g.RmsNorm(xr.t, Tensor{}, 1e-6f, yr.t));
    return absl::OkStatus();
  };
  absl::StatusOr<double> each = MicrosPerOp(g, 20, small_ops);
  absl::StatusOr<double> graph = MicrosPerOp(g, 20, [&]() -> absl::Status {
    if (!g.BeginCapture(1)) return absl::InternalError("BeginCapture declined");
    const absl::Status st = small_ops();
    PD_ASSIGN_OR_RETURN(const bool ran, g.EndCapture(st.ok()));
    PD_RETURN_IF_ERROR(st);
    return ran ? absl::OkStatus() : absl::InternalError("the recording was abandoned");
  });
  PD_ASSERT_OK(each.status());
  PD_ASSERT_OK(graph.status());
  std::printf(
      "[timing] %d one-row RmsNorms a step: launched one by one %8.1f us (%.2f us/op), "
      "recorded and launched as a graph %8.1f us (%.2f us/op)\n",
      kOps, *each, *each / kOps, *graph, *graph / kOps);
}

// Runs whenever there is a GPU, so that every GPU test log has these numbers (bench/gpu/ reads
// them).
TEST_F(CudaBackendTest, Timing) {
  std::printf("[timing] backend %s\n", std::string(cuda_->name()).c_str());
  const int64_t m = 4096, k = 4096;
  const std::vector<uint16_t> w16 = ToF16(RandomFloats(static_cast<size_t>(m * k), 11));
  Owned w = MapW(*cuda_, DType::kF16, m, k, w16.data());
  for (int64_t n : {1, 16, 512}) {
    const std::vector<float> x = RandomFloats(static_cast<size_t>(n * k), 12);
    Owned xt = Put(*cuda_, DType::kF32, n, k, x.data());
    Owned y = Put(*cuda_, DType::kF32, n, m, nullptr);
    absl::StatusOr<double> t =
        MicrosPerOp(*cuda_, 200, [&] { return cuda_->MatMul(w.t, xt.t, y.t); });
    PD_ASSERT_OK(t.status());
    const double us = *t;
    const double flops = 2.0 * m * k * n;
    const double bytes = 2.0 * m * k + 4.0 * n * k + 4.0 * n * m;
    std::printf("[timing] MatMul f16 m=%lld k=%lld n=%-4lld %9.2f us/op %8.2f TFLOP/s %8.1f GB/s\n",
                static_cast<long long>(m), static_cast<long long>(k), static_cast<long long>(n), us,
                flops / us * 1e-6, bytes / us * 1e-3);
  }
  const int64_t cols = 4096;
  const std::vector<float> wn = RandomFloats(static_cast<size_t>(cols), 13, 0.5f, 1.5f);
  Owned wt = Put(*cuda_, DType::kF32, 1, cols, wn.data());
  for (int64_t rows : {1, 16, 512}) {
    const std::vector<float> x = RandomFloats(static_cast<size_t>(rows * cols), 14);
    Owned xt = Put(*cuda_, DType::kF32, rows, cols, x.data());
    Owned y = Put(*cuda_, DType::kF32, rows, cols, nullptr);
    absl::StatusOr<double> t =
        MicrosPerOp(*cuda_, 1000, [&] { return cuda_->RmsNorm(xt.t, wt.t, 1e-6f, y.t); });
    PD_ASSERT_OK(t.status());
    const double us = *t;
    const double bytes = 8.0 * rows * cols + 4.0 * cols;  // read x, write y, read w
    std::printf("[timing] RmsNorm rows=%-4lld cols=%lld %9.2f us/op %8.1f GB/s\n",
                static_cast<long long>(rows), static_cast<long long>(cols), us, bytes / us * 1e-3);
  }
  // Quantized GEMV (decode, n = 1): Llama 7B's 4096 x 4096 projections and 11008 x 4096 gate/up.
  // Bound by the weight bytes, which is what GB/s counts (activations and outputs are < 0.1%).
  for (DType type : {DType::kQ4_K, DType::kQ6_K, DType::kQ8_0}) {
    for (int64_t rows : {4096, 11008}) {
      const int64_t cols = 4096;
      const std::vector<uint8_t> wq = RandomWeights(type, rows, cols, 15);
      Owned wt = MapW(*cuda_, type, rows, cols, wq.data());
      const std::vector<float> x = RandomFloats(static_cast<size_t>(cols), 16);
      Owned xt = Put(*cuda_, DType::kF32, 1, cols, x.data());
      Owned y = Put(*cuda_, DType::kF32, 1, rows, nullptr);
      absl::StatusOr<double> t =
          MicrosPerOp(*cuda_, 500, [&] { return cuda_->MatMul(wt.t, xt.t, y.t); });
      PD_ASSERT_OK(t.status());
      const double us = *t;
      const double bytes = static_cast<double>(wt.t.bytes());
      std::printf("[timing] MatMul %s GEMV m=%lld k=%lld n=1 %9.2f us/op %8.1f GB/s (weights)\n",
                  std::string(Traits(type).name).c_str(), static_cast<long long>(rows),
                  static_cast<long long>(cols), us, bytes / us * 1e-3);
    }
  }
  // A decode step's Q, K, V (3 x 4096 rows) and gate, up (2 x 11008 rows) of Llama 7B Q4_K: one
  // MatMul per weight against one MatMulGroup (one quantization, one launch).
  for (int64_t rows : {4096, 11008}) {
    const int parts = rows == 4096 ? 3 : 2;
    const int64_t cols = 4096;
    const std::vector<uint8_t> wq = RandomWeights(DType::kQ4_K, rows, cols, 17);
    std::vector<Owned> wt, y;
    std::vector<const Tensor*> ws;
    std::vector<Tensor*> ys;
    for (int i = 0; i < parts; ++i) {
      wt.push_back(MapW(*cuda_, DType::kQ4_K, rows, cols, wq.data()));
      y.push_back(Put(*cuda_, DType::kF32, 1, rows, nullptr));
    }
    for (int i = 0; i < parts; ++i) {
      ws.push_back(&wt[i].t);
      ys.push_back(&y[i].t);
    }
    const std::vector<float> x = RandomFloats(static_cast<size_t>(cols), 18);
    Owned xt = Put(*cuda_, DType::kF32, 1, cols, x.data());
    const std::vector<uint8_t> orders(1, kRowOrderGemv);
    absl::StatusOr<double> each = MicrosPerOp(*cuda_, 300, [&]() -> absl::Status {
      for (int i = 0; i < parts; ++i) PD_RETURN_IF_ERROR(cuda_->MatMul(*ws[i], xt.t, *ys[i]));
      return absl::OkStatus();
    });
    absl::StatusOr<double> group =
        MicrosPerOp(*cuda_, 300, [&] { return cuda_->MatMulGroup(ws, xt.t, ys, orders); });
    PD_ASSERT_OK(each.status());
    PD_ASSERT_OK(group.status());
    const double bytes = static_cast<double>(parts) * static_cast<double>(wt[0].t.bytes());
    std::printf(
        "[timing] MatMulGroup q4_K %d x m=%lld k=%lld n=1: one MatMul each %9.2f us (%7.1f GB/s), "
        "grouped %9.2f us (%7.1f GB/s)\n",
        parts, static_cast<long long>(rows), static_cast<long long>(cols), *each,
        bytes / *each * 1e-3, *group, bytes / *group * 1e-3);
  }

  // Attention decode over an F16 cache: one token per sequence, every sequence `ctx` positions
  // long. GB/s counts the K and V bytes each step must read once (n_seq * ctx * n_kv_heads *
  // head_dim * 2 bytes, twice).
  struct AttnTiming {
    const char* model;
    int n_heads, n_kv_heads, head_dim, n_seq, ctx;
  };
  for (const AttnTiming& a : {AttnTiming{"llama7b-gqa", 32, 8, 128, 1, 4096},
                              AttnTiming{"llama7b-gqa", 32, 8, 128, 8, 1024},
                              AttnTiming{"gemma3-270m", 4, 1, 256, 1, 4096},
                              AttnTiming{"gemma3-270m", 4, 1, 256, 16, 1024}}) {
    const int bs = 16;
    const int blocks_per_seq = (a.ctx + bs - 1) / bs;
    KvTensor kc{KvDType::kF16, a.n_kv_heads, a.head_dim, bs, int64_t{a.n_seq} * blocks_per_seq,
                nullptr};
    KvTensor vc = kc;
    absl::StatusOr<std::unique_ptr<Buffer>> kb = cuda_->Allocate(kc.bytes());
    absl::StatusOr<std::unique_ptr<Buffer>> vb = cuda_->Allocate(vc.bytes());
    PD_ASSERT_OK(kb.status());
    PD_ASSERT_OK(vb.status());
    kc.data = (*kb)->data();
    vc.data = (*vb)->data();
    // Values do not change the time; zeros keep every score finite.
    PD_ASSERT_OK(cuda_->Zero(kc.data, kc.bytes()));
    PD_ASSERT_OK(cuda_->Zero(vc.data, vc.bytes()));
    std::vector<std::vector<int32_t>> table_store(a.n_seq);
    std::vector<absl::Span<const int32_t>> tables;
    std::vector<int32_t> pos(a.n_seq, a.ctx - 1), seq(a.n_seq);
    for (int s = 0; s < a.n_seq; ++s) {
      seq[s] = s;
      for (int b = 0; b < blocks_per_seq; ++b) table_store[s].push_back(s * blocks_per_seq + b);
      tables.emplace_back(table_store[s]);
    }
    KvBatch kvb{pos, seq, tables, bs, {}};
    AttentionParams p{a.n_heads,  a.n_kv_heads,
                      a.head_dim, 1.f / std::sqrt(static_cast<float>(a.head_dim)),
                      0,          0.f};
    const int64_t cols = int64_t{a.n_heads} * a.head_dim;
    const std::vector<float> q = RandomFloats(static_cast<size_t>(a.n_seq * cols), 17);
    Owned qt = Put(*cuda_, DType::kF32, a.n_seq, cols, q.data());
    Owned out = Put(*cuda_, DType::kF32, a.n_seq, cols, nullptr);
    absl::StatusOr<double> t =
        MicrosPerOp(*cuda_, 200, [&] { return cuda_->Attention(qt.t, kc, vc, kvb, p, out.t); });
    PD_ASSERT_OK(t.status());
    const double us = *t;
    const double bytes = 2.0 * a.n_seq * a.ctx * a.n_kv_heads * a.head_dim * 2;
    std::printf(
        "[timing] Attention f16 decode %s heads=%d/%d head_dim=%d seqs=%d ctx=%d %9.2f "
        "us/op %8.1f GB/s (KV)\n",
        a.model, a.n_heads, a.n_kv_heads, a.head_dim, a.n_seq, a.ctx, us, bytes / us * 1e-3);
  }

  // Attention over a whole 2048-token prompt in one batch (prefill, F16 cache): through the
  // tiled kernel, then the same work through the per-row kernel (the rows given in reverse
  // order, which leaves no run of consecutive positions). TFLOP/s counts 4 * n_heads * head_dim
  // flops per visible (row, position) pair, n (n + 1) / 2 of them.
  struct PrefillTiming {
    const char* model;
    int n_heads, n_kv_heads, head_dim;
  };
  for (const PrefillTiming& a :
       {PrefillTiming{"llama-1b", 32, 8, 64}, PrefillTiming{"llama7b", 32, 32, 128}}) {
    const int n = 2048, bs = 16;
    KvTensor kc{KvDType::kF16, a.n_kv_heads, a.head_dim, bs, n / bs, nullptr};
    KvTensor vc = kc;
    absl::StatusOr<std::unique_ptr<Buffer>> kb = cuda_->Allocate(kc.bytes());
    absl::StatusOr<std::unique_ptr<Buffer>> vb = cuda_->Allocate(vc.bytes());
    PD_ASSERT_OK(kb.status());
    PD_ASSERT_OK(vb.status());
    kc.data = (*kb)->data();
    vc.data = (*vb)->data();
    PD_ASSERT_OK(cuda_->Zero(kc.data, kc.bytes()));
    PD_ASSERT_OK(cuda_->Zero(vc.data, vc.bytes()));
    std::vector<int32_t> table(n / bs);
    for (int b = 0; b < n / bs; ++b) table[b] = b;
    const int64_t cols = int64_t{a.n_heads} * a.head_dim;
    const std::vector<float> q = RandomFloats(static_cast<size_t>(n * cols), 18);
    Owned qt = Put(*cuda_, DType::kF32, n, cols, q.data());
    Owned out = Put(*cuda_, DType::kF32, n, cols, nullptr);
    AttentionParams p{a.n_heads,  a.n_kv_heads,
                      a.head_dim, 1.f / std::sqrt(static_cast<float>(a.head_dim)),
                      0,          0.f};
    const double flops = 4.0 * a.n_heads * a.head_dim * (double{n} * (n + 1) / 2);
    for (const bool per_row : {false, true}) {
      std::vector<int32_t> pos(n), seq(n, 0);
      for (int t = 0; t < n; ++t) pos[t] = per_row ? n - 1 - t : t;
      KvBatch kvb{pos, seq, {table}, bs, {}};
      absl::StatusOr<double> t = MicrosPerOp(
          *cuda_, per_row ? 5 : 50, [&] { return cuda_->Attention(qt.t, kc, vc, kvb, p, out.t); });
      PD_ASSERT_OK(t.status());
      std::printf(
          "[timing] Attention f16 prefill %s heads=%d/%d head_dim=%d tokens=%d %-8s %9.2f us/op "
          "%8.2f TFLOP/s\n",
          a.model, a.n_heads, a.n_kv_heads, a.head_dim, n, per_row ? "per-row" : "tiled", *t,
          flops / *t * 1e-6);
    }
  }
  std::fflush(stdout);
}

}  // namespace
}  // namespace pd::engine
