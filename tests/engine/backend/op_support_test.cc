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
  EXPECT_THAT(MissingOps("cuda", {"MatMul", "RmsNorm"}, {DType::kF32, DType::kF16}), IsEmpty());
  EXPECT_THAT(MissingOps("cuda", {"MatMul", "RmsNorm", "Rope", "Attention"},
                         {DType::kF16, DType::kQ4_K, DType::kQ4_K}),
              ElementsAre("Rope", "Attention", "MatMul with q4_K weights"));
  // Weight types only matter when the model multiplies by them.
  EXPECT_THAT(MissingOps("cuda", {"RmsNorm"}, {DType::kQ4_K}), IsEmpty());
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
  const std::string bytes = testing::TinyModel(spec);
  std::shared_ptr<const GgufFile> file = TinyFile(bytes);
  EXPECT_TRUE(Model::CheckBackend(*file, "cpu").ok());
  const absl::Status cuda = Model::CheckBackend(*file, "cuda");
  EXPECT_THAT(cuda, StatusIs(absl::StatusCode::kUnimplemented,
                             "the cuda backend cannot run this model (llama)"));
  EXPECT_THAT(std::string(cuda.message()),
              AllOf(HasSubstr("GetRows"), HasSubstr("Rope"), HasSubstr("Attention"),
                    HasSubstr("SwiGlu"), HasSubstr("MatMul with q8_0 weights"),
                    Not(HasSubstr("RmsNorm")), Not(HasSubstr("AddBias"))));
}

}  // namespace
}  // namespace pd::engine
