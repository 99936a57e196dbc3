// engine/model/fingerprint.h: equal files agree; a change in the metadata, a tensor's shape or
// type, or the start of a tensor's weights changes the fingerprint.
#include "engine/model/fingerprint.h"

#include <gtest/gtest.h>

#include <string>

#include "common/mapped_file.h"
#include "common/status.h"
#include "tests/testing/tiny_model.h"

namespace pd::engine {
namespace {

using testing::GgufBuilder;
using testing::TinyModel;
using testing::TinyModelSpec;

uint64_t Of(const std::string& bytes) {
  auto f = GgufFile::Parse(MappedFile::Borrow(bytes.data(), bytes.size()));
  PD_CHECK_OK(f.status());
  return ModelFingerprint(**f);
}

TEST(ModelFingerprintTest, EqualFilesAgreeAndEveryKindOfChangeDiffers) {
  const std::string base = TinyModel({});
  EXPECT_EQ(Of(base), Of(std::string(base)));  // another copy of the same bytes
  EXPECT_EQ(FingerprintHex(Of(base)).size(), 16u);

  TinyModelSpec other_weights;
  other_weights.seed = 2;  // same header, other weights
  EXPECT_NE(Of(TinyModel(other_weights)), Of(base));
  TinyModelSpec q8;
  q8.type = DType::kQ8_0;  // other tensor types
  EXPECT_NE(Of(TinyModel(q8)), Of(base));
  TinyModelSpec wider;
  wider.n_ff = 128;  // other shapes
  EXPECT_NE(Of(TinyModel(wider)), Of(base));
  TinyModelSpec meta;
  meta.metadata = [](GgufBuilder& b) { b.Str("general.name", "renamed"); };
  EXPECT_NE(Of(TinyModel(meta)), Of(base));
  TinyModelSpec tiny_change;
  tiny_change.perturb = 1e-3f;  // every weight nudged: the sampled starts differ as well
  EXPECT_NE(Of(TinyModel(tiny_change)), Of(base));
}

}  // namespace
}  // namespace pd::engine
