// The CPU backend with k-quant tensors: GetRows dequantizes rows exactly as DequantizeRow does;
// MatMul and MapWeights accept the weight formats and refuse Q8_K (activations only) with
// UNIMPLEMENTED.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/status_matchers.h"
#include "engine/backend/backend.h"
#include "engine/quant/k_quants.h"

namespace pd::engine {
namespace {

using ::pd::testing::IsOk;
using ::pd::testing::StatusIs;

uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

class KQuantsBackendTest : public ::testing::TestWithParam<DType> {};

TEST_P(KQuantsBackendTest, GetRowsDequantizes) {
  const DType t = GetParam();
  const int64_t rows = 7, cols = 512;
  std::mt19937 rng(9);
  std::normal_distribution<float> normal;
  std::vector<float> x(rows * cols);
  for (float& f : x) f = normal(rng);
  std::vector<char> table_bytes(RowBytes(t, cols) * rows);
  for (int64_t r = 0; r < rows; ++r) {
    QuantizeRow(t, x.data() + r * cols, table_bytes.data() + r * RowBytes(t, cols), cols);
  }
  Tensor table{t, cols, rows, table_bytes.data()};
  const std::vector<int32_t> ids = {6, 0, 3, 3, 1};
  std::vector<float> out_data(ids.size() * cols, -1.f);
  Tensor out{DType::kF32, cols, static_cast<int64_t>(ids.size()), out_data.data()};

  for (bool force_scalar : {false, true}) {
    std::unique_ptr<Backend> be = CreateCpuBackend({.force_scalar = force_scalar});
    ASSERT_THAT(be->GetRows(table, ids, out), IsOk());
    std::vector<float> want(cols);
    for (size_t i = 0; i < ids.size(); ++i) {
      DequantizeRow(t, table_bytes.data() + ids[i] * RowBytes(t, cols), want.data(), cols);
      for (int64_t c = 0; c < cols; ++c) {
        ASSERT_EQ(Bits(out_data[i * cols + c]), Bits(want[c])) << "row " << i << " col " << c;
      }
    }

    // MatMul runs the weight formats (checked in tests/engine/backend/k_quant_kernels_test.cc);
    // Q8_K is an activation format only: refused, never run.
    std::vector<float> act(2 * cols, 1.f), res(2 * rows);
    Tensor xt{DType::kF32, cols, 2, act.data()}, yt{DType::kF32, rows, 2, res.data()};
    std::unique_ptr<Buffer> storage;
    if (t == DType::kQ8_K) {
      EXPECT_THAT(be->MatMul(table, xt, yt),
                  StatusIs(absl::StatusCode::kUnimplemented, std::string(Traits(t).name)));
      EXPECT_THAT(be->MapWeights(table, &storage).status(),
                  StatusIs(absl::StatusCode::kUnimplemented));
    } else {
      EXPECT_THAT(be->MatMul(table, xt, yt), IsOk());
      EXPECT_THAT(be->MapWeights(table, &storage).status(), IsOk());
    }
  }

  // Row length not a whole number of blocks.
  Tensor bad = table;
  bad.cols = cols - 16;
  Tensor bad_out = out;
  bad_out.cols = bad.cols;
  EXPECT_THAT(CreateCpuBackend()->GetRows(bad, ids, bad_out),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

INSTANTIATE_TEST_SUITE_P(AllTypes, KQuantsBackendTest,
                         ::testing::Values(DType::kQ4_0, DType::kQ2_K, DType::kQ3_K, DType::kQ4_K,
                                           DType::kQ5_K, DType::kQ6_K, DType::kQ8_K),
                         [](const auto& info) { return std::string(Traits(info.param).name); });

}  // namespace
}  // namespace pd::engine
