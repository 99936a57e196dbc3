// op_support.h: which ops each backend kind lacks, known without a device; and Model's use of it
// to refuse a model at load time (engine/runtime/model.h, CheckBackend).
#include "engine/backend/op_support.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>

#include "common/mapped_file.h"
#include "common/status_matchers.h"
#include "engine/runtime/model.h"
#include "tests/testing/tiny_model.h"

namespace pd::engine {
namespace {

using ::pd::testing::StatusIs;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;

TEST(OpSupportTest, BackendKindIsTheNameBeforeTheDevice) {
  EXPECT_EQ(BackendKind("cpu"), "cpu");
  EXPECT_EQ(BackendKind("cuda:0 (NVIDIA H200, sm_90)"), "cuda");
}

TEST(OpSupportTest, TheCpuBackendRunsEveryOpAndType) {
  EXPECT_THAT(MissingOps("cpu", {"GetRows", "Rope", "Attention", "MatMul"},
                         {DType::kQ4_K, DType::kQ8_0, DType::kF16}),
              IsEmpty());
}

TEST(OpSupportTest, TheCudaBackendLacksWhatItDoesNotImplement) {
  // Every op of the forward pass, and the weight types of the default model and of every GGUF
  // type (Q4_0, Q2_K ... Q6_K, Q8_0, Q5_0).
  EXPECT_THAT(
      MissingOps("cuda",
                 {"MatMul", "RmsNorm", "Rope", "Attention", "StoreKv", "GetRows", "Add", "AddBias",
                  "SwiGlu", "GeGlu", "Scale", "Softmax"},
                 {DType::kF32, DType::kF16, DType::kBF16, DType::kQ8_0, DType::kQ4_0, DType::kQ5_0,
                  DType::kQ2_K, DType::kQ3_K, DType::kQ4_K, DType::kQ5_K, DType::kQ6_K}),
      IsEmpty());
  // Types without CUDA kernels yet are named, once each.
  EXPECT_THAT(
      MissingOps("cuda", {"MatMul", "RmsNorm"}, {DType::kF16, DType::kW4A16, DType::kW4A16}),
      ElementsAre("MatMul with w4a16 weights"));
  EXPECT_THAT(MissingOps("cuda", {"MatMul", "Fft"}, {DType::kW8A8}),
              ElementsAre("Fft", "MatMul with w8a8 weights"));
  // Weight types only matter when the model multiplies by them.
  EXPECT_THAT(MissingOps("cuda", {"RmsNorm"}, {DType::kW4A16}), IsEmpty());
}

TEST(OpSupportTest, AnUnknownBackendLacksEverything) {
  EXPECT_THAT(MissingOps("tpu", {"MatMul", "Rope"}, {}), ElementsAre("MatMul", "Rope"));
}

TEST(OpSupportTest, OpsUsedFollowTheArchitecture) {
  ModelConfig c;
  c.ffn_act = FfnActivation::kSilu;
  EXPECT_THAT(Model::OpsUsed(c),
              AllOf(::testing::Contains("SwiGlu"), Not(::testing::Contains("GeGlu")),
                    Not(::testing::Contains("AddBias"))));
  c.ffn_act = FfnActivation::kGeluTanh;
  c.qkv_bias = true;
  EXPECT_THAT(Model::OpsUsed(c),
              AllOf(::testing::Contains("GeGlu"), ::testing::Contains("AddBias")));
}

std::shared_ptr<const GgufFile> TinyFile(const std::string& bytes) {
  auto file = GgufFile::Parse(MappedFile::Borrow(bytes.data(), bytes.size()));
  EXPECT_TRUE(file.ok()) << file.status();
  return std::shared_ptr<const GgufFile>(std::move(*file));
}

TEST(OpSupportTest, CheckBackendNamesEveryMissingOpOfTheModel) {
  testing::TinyModelSpec spec;
  spec.type = DType::kQ8_0;
  spec.qkv_bias = true;
  const std::string bytes = testing::TinyModel(spec);
  std::shared_ptr<const GgufFile> file = TinyFile(bytes);
  EXPECT_TRUE(Model::CheckBackend(*file, "cpu").ok());
  EXPECT_TRUE(Model::CheckBackend(*file, "cuda").ok());
  const absl::Status tpu = Model::CheckBackend(*file, "tpu");
  EXPECT_THAT(tpu, StatusIs(absl::StatusCode::kUnimplemented,
                            "the tpu backend cannot run this model (llama)"));
  EXPECT_THAT(std::string(tpu.message()),
              AllOf(HasSubstr("GetRows"), HasSubstr("Rope"), HasSubstr("Attention"),
                    HasSubstr("SwiGlu"), HasSubstr("AddBias"), HasSubstr("RmsNorm"),
                    Not(HasSubstr("GeGlu"))));
}

// Qwen3 (QK norm) and Phi-3 (fused matrices, query scale, window) need no op beyond the Llama
// set plus Scale: the CUDA backend runs both; an op it lacks would be named with the
// architecture.
TEST(OpSupportTest, Qwen3AndPhi3RunOnCuda) {
  const testing::TinyModelSpec specs[] = {
      {.arch = "qwen3", .head_dim = 32, .qk_norm = true, .type = DType::kQ8_0},
      {.arch = "phi3", .fused = true, .sliding_window = 8, .type = DType::kQ8_0},
  };
  for (const testing::TinyModelSpec& spec : specs) {
    SCOPED_TRACE(spec.arch);
    const std::string bytes = testing::TinyModel(spec);
    std::shared_ptr<const GgufFile> file = TinyFile(bytes);
    PD_EXPECT_OK(Model::CheckBackend(*file, "cpu"));
    PD_EXPECT_OK(Model::CheckBackend(*file, "cuda"));
    EXPECT_THAT(Model::CheckBackend(*file, "tpu"),
                StatusIs(absl::StatusCode::kUnimplemented,
                         "the tpu backend cannot run this model (" + spec.arch + ")"));
  }
  const std::string phi3 = testing::TinyModel({.arch = "phi3", .fused = true, .sliding_window = 8});
  auto c = ModelConfig::FromGguf(*TinyFile(phi3));
  PD_ASSERT_OK(c);
  EXPECT_THAT(Model::OpsUsed(*c), ::testing::Contains("Scale"));  // the query scale
}

}  // namespace
}  // namespace pd::engine
