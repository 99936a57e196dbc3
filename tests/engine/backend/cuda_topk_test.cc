// Backend::TopK on CUDA against the CPU backend: bit-exact ids and values (both rank by the same
// integer key, top_k.h; nothing is rounded). Part of cuda_backend_test (bench/gpu/ stages it);
// skipped without a GPU.
//
// On a GPU, CudaTopKTest.Timing prints the op's time for vocabulary-sized rows next to the copy of
// the whole rows that it replaces.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <utility>
#include <vector>

#include "common/status.h"
#include "common/status_matchers.h"
#include "engine/backend/backend.h"

namespace pd::engine {
namespace {

class CudaTopKTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<Backend>> cuda = CreateCudaBackend(0);
    if (!cuda.ok()) GTEST_SKIP() << "needs a CUDA GPU: " << cuda.status();
    cuda_ = *std::move(cuda);
    cpu_ = CreateCpuBackend();
  }

  // Logits on a coarse grid (many ties, several equal to the k-th), with NaN, both zeros and
  // infinities sprinkled in.
  static std::vector<float> Logits(int64_t rows, int64_t cols, uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> n(0.f, 3.f);
    std::vector<float> x(static_cast<size_t>(rows * cols));
    for (float& v : x) v = std::round(n(rng) * 8.f) / 8.f;
    for (int64_t r = 0; r < rows; ++r) {
      float* row = x.data() + r * cols;
      row[(7 * r + 3) % cols] = NAN;
      row[(11 * r + 1) % cols] = -0.f;
      if (r % 3 == 0) row[(13 * r + 5) % cols] = INFINITY;
      row[(17 * r + 2) % cols] = -INFINITY;
    }
    return x;
  }

  std::unique_ptr<Backend> cuda_;
  std::unique_ptr<Backend> cpu_;
};

TEST_F(CudaTopKTest, MatchesTheCpuBitForBit) {
  for (const auto& [rows, cols] : std::vector<std::pair<int64_t, int64_t>>{
           {1, 5}, {3, 300}, {1, 32000}, {16, 128256}, {64, 262144}, {2, 151936}}) {
    const std::vector<float> x = Logits(rows, cols, static_cast<uint32_t>(rows * 31 + cols));
    absl::StatusOr<std::unique_ptr<Buffer>> dx = cuda_->Allocate(x.size() * sizeof(float));
    PD_ASSERT_OK(dx.status());
    PD_ASSERT_OK(cuda_->Upload((*dx)->data(), x.data(), x.size() * sizeof(float)));
    Tensor gx{DType::kF32, cols, rows, (*dx)->data()};
    Tensor hx{DType::kF32, cols, rows, const_cast<float*>(x.data())};
    for (const int k : {1, 2, 5, 40, 50, 256}) {
      if (k > cols) continue;
      SCOPED_TRACE(::testing::Message() << rows << "x" << cols << " k=" << k);
      const size_t n = static_cast<size_t>(rows) * k;
      absl::StatusOr<std::unique_ptr<Buffer>> dv = cuda_->Allocate(n * sizeof(float));
      absl::StatusOr<std::unique_ptr<Buffer>> di = cuda_->Allocate(n * sizeof(int32_t));
      PD_ASSERT_OK(dv.status());
      PD_ASSERT_OK(di.status());
      Tensor gv{DType::kF32, k, rows, (*dv)->data()};
      PD_ASSERT_OK(cuda_->TopK(gx, k, gv, static_cast<int32_t*>((*di)->data())));
      std::vector<float> got_v(n), want_v(n);
      std::vector<int32_t> got_i(n), want_i(n);
      PD_ASSERT_OK(cuda_->Download(got_v.data(), (*dv)->data(), n * sizeof(float)));
      PD_ASSERT_OK(cuda_->Download(got_i.data(), (*di)->data(), n * sizeof(int32_t)));
      PD_ASSERT_OK(cuda_->Synchronize());
      Tensor hv{DType::kF32, k, rows, want_v.data()};
      PD_ASSERT_OK(cpu_->TopK(hx, k, hv, want_i.data()));
      ASSERT_EQ(got_i, want_i);
      ASSERT_EQ(std::memcmp(got_v.data(), want_v.data(), n * sizeof(float)), 0);
    }
  }
}

TEST_F(CudaTopKTest, RefusesBadArguments) {
  absl::StatusOr<std::unique_ptr<Buffer>> d = cuda_->Allocate(4096);
  PD_ASSERT_OK(d.status());
  Tensor x{DType::kF32, 10, 2, (*d)->data()};
  Tensor v{DType::kF32, 3, 2, static_cast<char*>((*d)->data()) + 1024};
  int32_t* ids = reinterpret_cast<int32_t*>(static_cast<char*>((*d)->data()) + 2048);
  EXPECT_EQ(cuda_->TopK(x, 0, v, ids).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cuda_->TopK(x, 11, v, ids).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cuda_->TopK(x, 2, v, ids).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cuda_->TopK(x, 3, v, nullptr).code(), absl::StatusCode::kInvalidArgument);
  PD_EXPECT_OK(cuda_->TopK(x, 3, v, ids));
  PD_EXPECT_OK(cuda_->Synchronize());
}

// The op against the copy it saves: downloading rows x 262144 logits (Gemma 3's vocabulary).
TEST_F(CudaTopKTest, Timing) {
  constexpr int64_t kCols = 262144;
  for (const int64_t rows : {1, 16, 64}) {
    const std::vector<float> x = Logits(rows, kCols, 5);
    absl::StatusOr<std::unique_ptr<Buffer>> dx = cuda_->Allocate(x.size() * sizeof(float));
    absl::StatusOr<std::unique_ptr<Buffer>> dv = cuda_->Allocate(rows * kMaxTopK * sizeof(float));
    absl::StatusOr<std::unique_ptr<Buffer>> di = cuda_->Allocate(rows * kMaxTopK * 4);
    PD_ASSERT_OK(dx.status());
    PD_ASSERT_OK(dv.status());
    PD_ASSERT_OK(di.status());
    PD_ASSERT_OK(cuda_->Upload((*dx)->data(), x.data(), x.size() * sizeof(float)));
    Tensor gx{DType::kF32, kCols, rows, (*dx)->data()};
    std::vector<float> host(x.size());
    const auto time_ms = [&](auto&& fn) {
      for (int i = 0; i < 3; ++i) fn();
      PD_CHECK_OK(cuda_->Synchronize());
      constexpr int kReps = 20;
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < kReps; ++i) fn();
      PD_CHECK_OK(cuda_->Synchronize());
      return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                 .count() /
             kReps;
    };
    const double copy_ms = time_ms(
        [&] { PD_CHECK_OK(cuda_->Download(host.data(), (*dx)->data(), x.size() * 4)); });
    for (const int k : {1, 40}) {
      Tensor gv{DType::kF32, k, rows, (*dv)->data()};
      const double top_ms = time_ms(
          [&] { PD_CHECK_OK(cuda_->TopK(gx, k, gv, static_cast<int32_t*>((*di)->data()))); });
      std::printf("[timing] TopK rows=%-3lld cols=%lld k=%-3d %9.2f us/op (download of the rows"
                  " %9.2f us)\n",
                  static_cast<long long>(rows), static_cast<long long>(kCols), k, 1e3 * top_ms,
                  1e3 * copy_ms);
    }
  }
}

}  // namespace
}  // namespace pd::engine
