// The CUDA backend against the CPU reference, plus its behaviour on machines without a GPU.
//
// Without a usable device every test that needs one is skipped (GTEST_SKIP with the reason), and
// the tests that check the no-device path run instead.
//
// Tolerances, per output element, against the CPU backend's result on the same inputs:
//   MatMul f32:  |gpu - cpu| <= 1e-5 * S + 1e-6, S = sum_j |w[i,j] * x[r,j]|. Both sides form exact
//                F32 products and add them in F32, only in different orders (cuBLAS runs plain
//                FP32 SGEMM, no TF32); reordering a k-term F32 sum moves it by at most
//                ~k * 2^-24 * S and typically far less.
//   MatMul f16:  |gpu - cpu| <= 5e-4 * S + 1e-5. Both sides round x to F16 the same way (RNE), and
//                products of halves are exact in F32, but tensor cores accumulate in F32 with
//                their own order and rounding. A wrong layout or a missed conversion shows up
//                as errors of order |y| ~ S / sqrt(k), far above this for every k tested.
//   RmsNorm:     |gpu - cpu| <= 1e-5 * |cpu| + 1e-6 (the CPU sums squares in F64, the GPU in F32
//                with a tree reduction; rsqrtf is within 2 ulp).
// Upload/Download/Zero/MapWeights are bit exact.
//
// On a GPU, CudaBackendTest.Timing also prints MatMul f16 and RmsNorm timings (bench/gpu/ reads
// them).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "common/status.h"
#include "common/status_matchers.h"
#include "engine/backend/backend.h"
#include "engine/quant/dtype.h"
#include "engine/quant/fp16.h"

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

// ---- what the CUDA backend does not run yet
// ------------------------------------------------------

TEST_F(CudaBackendTest, UnimplementedOpsSayUnimplemented) {
  Owned a = Put(*cuda_, DType::kF32, 2, 64, nullptr);
  Owned b = Put(*cuda_, DType::kF32, 2, 64, nullptr);
  Owned y = Put(*cuda_, DType::kF32, 2, 64, nullptr);
  constexpr absl::StatusCode kUnimplemented = absl::StatusCode::kUnimplemented;
  EXPECT_THAT(cuda_->Softmax(a.t), StatusIs(kUnimplemented, "Softmax"));
  EXPECT_THAT(cuda_->Add(a.t, b.t, y.t), StatusIs(kUnimplemented, "Add"));
  EXPECT_THAT(cuda_->SwiGlu(a.t, b.t, y.t), StatusIs(kUnimplemented, "SwiGlu"));
  const int32_t ids[] = {0, 1};
  EXPECT_THAT(cuda_->GetRows(a.t, ids, y.t), StatusIs(kUnimplemented, "GetRows"));

  // MatMul with weight types that have no CUDA path yet names the type.
  Owned x = Put(*cuda_, DType::kF32, 2, 64, nullptr);
  Owned out = Put(*cuda_, DType::kF32, 2, 4, nullptr);
  Owned bf16 = Put(*cuda_, DType::kBF16, 4, 64, nullptr);
  Owned q8 = Put(*cuda_, DType::kQ8_0, 4, 64, nullptr);
  EXPECT_THAT(cuda_->MatMul(bf16.t, x.t, out.t), StatusIs(kUnimplemented, "bf16"));
  EXPECT_THAT(cuda_->MatMul(q8.t, x.t, out.t), StatusIs(kUnimplemented, "q8_0"));
  PD_EXPECT_OK(cuda_->Synchronize());
}

// No KV kernels yet: StoreKv and Attention refuse every cache type, and name INT8 when asked
// for it (the CPU backend runs INT8 KV; a caller should learn the type is what is missing here).
TEST_F(CudaBackendTest, KvOpsSayUnimplementedAndNameInt8) {
  Owned q = Put(*cuda_, DType::kF32, 1, 64, nullptr);
  Owned kv = Put(*cuda_, DType::kF32, 1, 64, nullptr);
  Owned out = Put(*cuda_, DType::kF32, 1, 64, nullptr);
  auto cache = cuda_->Allocate(4096);
  ASSERT_TRUE(cache.ok()) << cache.status();
  KvTensor c{KvDType::kI8, 1, 64, 4, 2, (*cache)->data()};
  const std::vector<int32_t> table = {0}, pos = {0}, seq = {0};
  KvBatch b{pos, seq, {table}, 4};
  AttentionParams p{1, 1, 64, 0.125f, 0, 0.f};
  constexpr absl::StatusCode kUnimplemented = absl::StatusCode::kUnimplemented;
  EXPECT_THAT(cuda_->StoreKv(kv.t, kv.t, c, c, b), StatusIs(kUnimplemented, "int8 KV"));
  EXPECT_THAT(cuda_->Attention(q.t, c, c, b, p, out.t), StatusIs(kUnimplemented, "int8 KV"));
  c.type = KvDType::kF16;
  EXPECT_THAT(cuda_->Attention(q.t, c, c, b, p, out.t), StatusIs(kUnimplemented, "Attention"));
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
  std::fflush(stdout);
}

}  // namespace
}  // namespace pd::engine
