#include "engine/model/gguf.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "common/status_matchers.h"
#include "common/strings.h"
#include "tests/testing/gguf_builder.h"

namespace pd::engine {
namespace {

using ::pd::engine::testing::AlignUp;
using ::pd::engine::testing::Bytes;
using ::pd::engine::testing::GgufBuilder;
using ::pd::engine::testing::kTypeBF16;
using ::pd::engine::testing::kTypeF16;
using ::pd::engine::testing::kTypeF32;
using ::pd::engine::testing::kTypeQ8_0;
using ::pd::engine::testing::ParseBytes;
using ::pd::engine::testing::TensorSpec;
using ::pd::testing::IsOk;
using ::pd::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr uint64_t kU64Max = std::numeric_limits<uint64_t>::max();

uint32_t TypeId(GgufValueType t) { return static_cast<uint32_t>(t); }

// A small valid file with a little of everything, used by the truncation sweep.
GgufBuilder RichFile() {
  GgufBuilder b;
  b.Str("general.architecture", "llama")
      .U32("llama.block_count", 2)
      .I8("k.i8", -3)
      .U16("k.u16", 7)
      .I16("k.i16", -9)
      .U64("k.u64", 12345678901234ull)
      .I64("k.i64", -5)
      .F32("k.f32", 0.5f)
      .F64("k.f64", 0.25)
      .Bool("k.bool", true)
      .Array<int32_t>("k.ai32", GgufValueType::kInt32, {1, -2, 3})
      .Array<uint8_t>("k.abool", GgufValueType::kBool, {1, 0})
      .StrArray("tokenizer.ggml.tokens", {"<s>", "", "hello"});
  // array of 2 arrays of uint16
  Bytes nested;
  nested.U32(TypeId(GgufValueType::kArray)).U64(2);
  nested.U32(TypeId(GgufValueType::kUint16)).U64(1).U16(5);
  nested.U32(TypeId(GgufValueType::kUint16)).U64(2).U16(6).U16(7);
  b.Kv("k.nested", GgufValueType::kArray, nested);
  b.Tensor("a", {8, 2}, kTypeF32).Tensor("b", {32}, kTypeQ8_0).Tensor("c", {4}, kTypeF16);
  return b;
}

// ------------------------------------------------------------------------------------------------
// Valid files
// ------------------------------------------------------------------------------------------------

TEST(GgufTest, EmptyFileWithOnlyAHeaderParses) {
  const std::string bytes = GgufBuilder().Build();
  ASSERT_EQ(bytes.size(), 24u);
  auto f = ParseBytes(bytes);
  PD_ASSERT_OK(f);
  EXPECT_EQ((*f)->version(), 3u);
  EXPECT_EQ((*f)->alignment(), 32u);
  EXPECT_TRUE((*f)->metadata().empty());
  EXPECT_TRUE((*f)->tensors().empty());
  EXPECT_EQ((*f)->file_size(), 24u);
}

TEST(GgufTest, AcceptsVersion2And3) {
  for (uint32_t v : {2u, 3u}) {
    const std::string bytes = GgufBuilder(v).U32("x", 1).Tensor("t", {4}).Build();
    auto f = ParseBytes(bytes);
    PD_ASSERT_OK(f) << "version " << v;
    EXPECT_EQ((*f)->version(), v);
    EXPECT_EQ((*f)->tensors().size(), 1u);
  }
}

TEST(GgufTest, ScalarValuesOfEveryType) {
  const std::string bytes = GgufBuilder()
                                .U8("u8", 200)
                                .I8("i8", -100)
                                .U16("u16", 60000)
                                .I16("i16", -30000)
                                .U32("u32", 4000000000u)
                                .I32("i32", -2000000000)
                                .F32("f32", 1.5f)
                                .Bool("yes", true)
                                .Bool("no", false)
                                .Str("s", "hello")
                                .U64("u64", (uint64_t{1} << 63) + 5)
                                .I64("i64", -(int64_t{1} << 62))
                                .F64("f64", -3.25)
                                .Build();
  auto f = ParseBytes(bytes);
  PD_ASSERT_OK(f);
  const GgufFile& g = **f;
  EXPECT_EQ(g.metadata().size(), 13u);

  EXPECT_EQ(g.Find("u8")->type, GgufValueType::kUint8);
  EXPECT_EQ(g.Find("i8")->type, GgufValueType::kInt8);
  EXPECT_EQ(g.Find("u16")->type, GgufValueType::kUint16);
  EXPECT_EQ(g.Find("i16")->type, GgufValueType::kInt16);
  EXPECT_EQ(g.Find("u32")->type, GgufValueType::kUint32);
  EXPECT_EQ(g.Find("i32")->type, GgufValueType::kInt32);
  EXPECT_EQ(g.Find("f32")->type, GgufValueType::kFloat32);
  EXPECT_EQ(g.Find("yes")->type, GgufValueType::kBool);
  EXPECT_EQ(g.Find("s")->type, GgufValueType::kString);
  EXPECT_EQ(g.Find("u64")->type, GgufValueType::kUint64);
  EXPECT_EQ(g.Find("i64")->type, GgufValueType::kInt64);
  EXPECT_EQ(g.Find("f64")->type, GgufValueType::kFloat64);

  EXPECT_EQ(*g.GetUint("u8"), 200u);
  EXPECT_EQ(*g.GetInt("i8"), -100);
  EXPECT_EQ(*g.GetUint("u16"), 60000u);
  EXPECT_EQ(*g.GetInt("i16"), -30000);
  EXPECT_EQ(*g.GetUint("u32"), 4000000000u);
  EXPECT_EQ(*g.GetInt("i32"), -2000000000);
  EXPECT_EQ(*g.GetFloat("f32"), 1.5);
  EXPECT_EQ(*g.GetBool("yes"), true);
  EXPECT_EQ(*g.GetBool("no"), false);
  EXPECT_EQ(*g.GetString("s"), "hello");
  EXPECT_EQ(*g.GetUint("u64"), (uint64_t{1} << 63) + 5);
  EXPECT_EQ(*g.GetInt("i64"), -(int64_t{1} << 62));
  EXPECT_EQ(*g.GetFloat("f64"), -3.25);
  EXPECT_TRUE(g.Has("u8"));
  EXPECT_FALSE(g.Has("u9"));
  EXPECT_EQ(g.Find("u9"), nullptr);
}

TEST(GgufTest, StringsKeepArbitraryBytes) {
  const std::string weird("a\0b\xff", 4);
  const std::string bytes = GgufBuilder().Str("w", weird).Str("empty", "").Build();
  auto f = ParseBytes(bytes);
  PD_ASSERT_OK(f);
  EXPECT_EQ(*(*f)->GetString("w"), weird);
  EXPECT_EQ(*(*f)->GetString("empty"), "");
}

TEST(GgufTest, NumericArraysOfEveryType) {
  const std::string bytes =
      GgufBuilder()
          .Array<uint8_t>("u8", GgufValueType::kUint8, {0, 255})
          .Array<int8_t>("i8", GgufValueType::kInt8, {-128, 127})
          .Array<uint16_t>("u16", GgufValueType::kUint16, {1, 65535})
          .Array<int16_t>("i16", GgufValueType::kInt16, {-32768, 2})
          .Array<uint32_t>("u32", GgufValueType::kUint32, {3, 4000000000u})
          .Array<int32_t>("i32", GgufValueType::kInt32, {-7, 8})
          .Array<uint64_t>("u64", GgufValueType::kUint64, {9, uint64_t{1} << 40})
          .Array<int64_t>("i64", GgufValueType::kInt64, {-(int64_t{1} << 50), 10})
          .Array<float>("f32", GgufValueType::kFloat32, {0.5f, -1.25f, 3.0f})
          .Array<double>("f64", GgufValueType::kFloat64, {2.5, -0.125})
          .Array<uint8_t>("bool", GgufValueType::kBool, {1, 0, 1})
          .Array<uint32_t>("none", GgufValueType::kUint32, {})
          .Build();
  auto f = ParseBytes(bytes);
  PD_ASSERT_OK(f);
  const GgufFile& g = **f;

  const GgufValue* v = g.Find("u16");
  ASSERT_NE(v, nullptr);
  EXPECT_EQ(v->type, GgufValueType::kArray);
  EXPECT_EQ(v->elem_type, GgufValueType::kUint16);
  EXPECT_EQ(v->count, 2u);

  EXPECT_THAT(*g.GetIntArray("u8"), ElementsAre(0, 255));
  EXPECT_THAT(*g.GetIntArray("i8"), ElementsAre(-128, 127));
  EXPECT_THAT(*g.GetIntArray("u16"), ElementsAre(1, 65535));
  EXPECT_THAT(*g.GetIntArray("i16"), ElementsAre(-32768, 2));
  EXPECT_THAT(*g.GetIntArray("u32"), ElementsAre(3, 4000000000ll));
  EXPECT_THAT(*g.GetIntArray("i32"), ElementsAre(-7, 8));
  EXPECT_THAT(*g.GetIntArray("u64"), ElementsAre(9, int64_t{1} << 40));
  EXPECT_THAT(*g.GetIntArray("i64"), ElementsAre(-(int64_t{1} << 50), 10));
  EXPECT_THAT(*g.GetIntArray("none"), ElementsAre());

  EXPECT_THAT(*g.GetFloatArray("f32"), ElementsAre(0.5f, -1.25f, 3.0f));
  EXPECT_THAT(*g.GetFloatArray("f64"), ElementsAre(2.5f, -0.125f));
  EXPECT_THAT(*g.GetFloatArray("i8"), ElementsAre(-128.f, 127.f));
  EXPECT_THAT(*g.GetFloatArray("u8"), ElementsAre(0.f, 255.f));
  EXPECT_THAT(*g.GetFloatArray("u16"), ElementsAre(1.f, 65535.f));
  EXPECT_THAT(*g.GetFloatArray("i16"), ElementsAre(-32768.f, 2.f));
  EXPECT_THAT(*g.GetFloatArray("u32"), ElementsAre(3.f, 4e9f));
  EXPECT_THAT(*g.GetFloatArray("i32"), ElementsAre(-7.f, 8.f));
  EXPECT_THAT(*g.GetFloatArray("u64"), ElementsAre(9.f, 1099511627776.f));
  EXPECT_THAT(*g.GetFloatArray("i64"), ElementsAre(-1125899906842624.f, 10.f));

  const GgufValue* b = g.Find("bool");
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->elem_type, GgufValueType::kBool);
  ASSERT_EQ(b->count, 3u);
  EXPECT_EQ(b->raw[0], 1);
  EXPECT_EQ(b->raw[1], 0);
  EXPECT_EQ(b->raw[2], 1);
  // Bools are neither ints nor floats.
  EXPECT_THAT(g.GetIntArray("bool"), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(g.GetFloatArray("bool"), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(GgufTest, ArraysOfStrings) {
  const std::string nul("x\0y", 3);
  const std::string bytes =
      GgufBuilder().StrArray("toks", {"<s>", "", "hello world", nul}).StrArray("none", {}).Build();
  auto f = ParseBytes(bytes);
  PD_ASSERT_OK(f);
  auto toks = (*f)->GetStringArray("toks");
  PD_ASSERT_OK(toks);
  ASSERT_EQ(toks->size(), 4u);
  EXPECT_EQ((*toks)[0], "<s>");
  EXPECT_EQ((*toks)[1], "");
  EXPECT_EQ((*toks)[2], "hello world");
  EXPECT_EQ((*toks)[3], nul);
  EXPECT_EQ((*f)->Find("toks")->count, 4u);
  EXPECT_THAT(*(*f)->GetStringArray("none"), ElementsAre());
  // Numbers are not strings and vice versa.
  EXPECT_THAT((*f)->GetIntArray("toks"), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT((*f)->GetFloatArray("toks"), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(GgufTest, NestedArraysParseAndAreSkipped) {
  // [[1, 2], [], [3]] of uint32, then [["a"], ["b", "c"]] of strings, then a scalar after them
  // to prove the cursor advanced past exactly the nested bytes.
  Bytes ints;
  ints.U32(TypeId(GgufValueType::kArray)).U64(3);
  ints.U32(TypeId(GgufValueType::kUint32)).U64(2).U32(1).U32(2);
  ints.U32(TypeId(GgufValueType::kUint32)).U64(0);
  ints.U32(TypeId(GgufValueType::kUint32)).U64(1).U32(3);
  Bytes strs;
  strs.U32(TypeId(GgufValueType::kArray)).U64(2);
  strs.U32(TypeId(GgufValueType::kString)).U64(1).Str("a");
  strs.U32(TypeId(GgufValueType::kString)).U64(2).Str("b").Str("c");
  const std::string bytes = GgufBuilder()
                                .Kv("ints", GgufValueType::kArray, ints)
                                .Kv("strs", GgufValueType::kArray, strs)
                                .U32("after", 77)
                                .Build();
  auto f = ParseBytes(bytes);
  PD_ASSERT_OK(f);
  const GgufValue* v = (*f)->Find("ints");
  ASSERT_NE(v, nullptr);
  EXPECT_EQ(v->type, GgufValueType::kArray);
  EXPECT_EQ(v->elem_type, GgufValueType::kArray);
  EXPECT_EQ(v->count, 3u);
  EXPECT_EQ((*f)->Find("strs")->count, 2u);
  EXPECT_EQ(*(*f)->GetUint("after"), 77u);
  EXPECT_THAT((*f)->GetIntArray("ints"), StatusIs(absl::StatusCode::kInvalidArgument, "array"));
  EXPECT_THAT((*f)->GetStringArray("strs"), StatusIs(absl::StatusCode::kInvalidArgument));
}

// Arrays nested `depth` deep, the innermost holding one uint8.
Bytes NestedArray(int depth) {
  Bytes b;
  for (int i = 1; i < depth; ++i) b.U32(TypeId(GgufValueType::kArray)).U64(1);
  b.U32(TypeId(GgufValueType::kUint8)).U64(1).U8(9);
  return b;
}

TEST(GgufTest, NestingDepthIsLimited) {
  {
    const std::string bytes = GgufBuilder().Kv("ok", GgufValueType::kArray, NestedArray(4)).Build();
    PD_EXPECT_OK(ParseBytes(bytes));
  }
  {
    const std::string bytes =
        GgufBuilder().Kv("deep", GgufValueType::kArray, NestedArray(5)).Build();
    EXPECT_THAT(ParseBytes(bytes),
                StatusIs(absl::StatusCode::kInvalidArgument, "'deep': arrays nested deeper"));
  }
  {
    // A hostile file cannot recurse without bound: 100000 levels fail cleanly.
    const std::string bytes =
        GgufBuilder().Kv("abyss", GgufValueType::kArray, NestedArray(100000)).Build();
    EXPECT_THAT(ParseBytes(bytes), StatusIs(absl::StatusCode::kInvalidArgument, "nested"));
  }
}

TEST(GgufTest, TensorInfosAndDataPointers) {
  GgufBuilder b;
  b.Str("general.architecture", "llama")
      .Tensor("w", {8, 3}, kTypeF32)
      .Tensor("h", {8, 3}, kTypeF16)
      .Tensor("bf", {8, 3}, kTypeBF16)
      .Tensor("q", {64, 3}, kTypeQ8_0)
      .Tensor("four", {2, 3, 4, 5}, kTypeF32);
  const std::string bytes = b.Build();
  auto f = ParseBytes(bytes);
  PD_ASSERT_OK(f);
  const GgufFile& g = **f;
  ASSERT_EQ(g.tensors().size(), 5u);

  const auto* base = reinterpret_cast<const uint8_t*>(bytes.data());
  const uint64_t data_start = b.DataStart();
  EXPECT_EQ(data_start % 32, 0u);
  EXPECT_GE(data_start, b.HeaderSize());
  const std::vector<uint64_t> offsets = b.Offsets();

  struct Want {
    const char* name;
    DType type;
    std::vector<int64_t> shape;
    size_t nbytes;
    int64_t numel, rows;
  };
  const Want want[] = {
      {"w", DType::kF32, {8, 3}, 96, 24, 3},
      {"h", DType::kF16, {8, 3}, 48, 24, 3},
      {"bf", DType::kBF16, {8, 3}, 48, 24, 3},
      {"q", DType::kQ8_0, {64, 3}, 2 * 34 * 3, 192, 3},
      {"four", DType::kF32, {2, 3, 4, 5}, 480, 120, 60},
  };
  for (size_t i = 0; i < 5; ++i) {
    SCOPED_TRACE(want[i].name);
    const GgufTensorInfo& t = g.tensors()[i];
    EXPECT_EQ(t.name, want[i].name);
    EXPECT_EQ(t.type, want[i].type);
    EXPECT_EQ(t.shape, want[i].shape);
    EXPECT_EQ(t.nbytes, want[i].nbytes);
    EXPECT_EQ(t.numel(), want[i].numel);
    EXPECT_EQ(t.rows(), want[i].rows);
    EXPECT_EQ(t.offset, offsets[i]);
    EXPECT_EQ(t.offset % 32, 0u);
    EXPECT_EQ(t.data, base + data_start + offsets[i]);
    // The bytes behind the pointer are the ones written for this tensor.
    for (size_t j = 0; j < t.nbytes; ++j) {
      ASSERT_EQ(static_cast<char>(t.data[j]), GgufBuilder::PatternByte(i, j)) << "byte " << j;
    }
    EXPECT_EQ(g.FindTensor(want[i].name), &t);
  }
  EXPECT_EQ(g.FindTensor("nope"), nullptr);
}

TEST(GgufTest, F32TensorValuesReadBack) {
  std::string data(16, '\0');
  const float vals[4] = {1.0f, -2.5f, 3.25f, 1e-3f};
  std::memcpy(data.data(), vals, 16);
  const std::string bytes =
      GgufBuilder().Tensor(TensorSpec{"v", {4}, kTypeF32, std::nullopt, data}).Build();
  auto f = ParseBytes(bytes);
  PD_ASSERT_OK(f);
  const GgufTensorInfo* t = (*f)->FindTensor("v");
  ASSERT_NE(t, nullptr);
  float got[4];
  std::memcpy(got, t->data, 16);
  EXPECT_THAT(got, ElementsAre(1.0f, -2.5f, 3.25f, 1e-3f));
}

TEST(GgufTest, CustomAlignment) {
  GgufBuilder b;
  b.Alignment(64).U32("general.alignment", 64).Tensor("a", {3}).Tensor("b", {5});
  const std::string bytes = b.Build();
  auto f = ParseBytes(bytes);
  PD_ASSERT_OK(f);
  EXPECT_EQ((*f)->alignment(), 64u);
  const auto* base = reinterpret_cast<const uint8_t*>(bytes.data());
  const uint64_t data_start = AlignUp(b.HeaderSize(), 64);
  // With alignment 64 the second tensor (after 12 bytes) sits at 64, not 32.
  EXPECT_EQ((*f)->tensors()[1].offset, 64u);
  EXPECT_EQ((*f)->tensors()[0].data, base + data_start);
  EXPECT_EQ((*f)->tensors()[1].data, base + data_start + 64);
  EXPECT_EQ(static_cast<char>((*f)->tensors()[1].data[0]), GgufBuilder::PatternByte(1, 0));
}

TEST(GgufTest, SmallCustomAlignmentPacksTightly) {
  GgufBuilder b;
  b.Alignment(4)
      .U32("general.alignment", 4)
      .Tensor("a", {3})
      .Tensor("b", {1}, kTypeF16)
      .Tensor("c", {1});
  const std::string bytes = b.Build();
  auto f = ParseBytes(bytes);
  PD_ASSERT_OK(f);
  EXPECT_EQ((*f)->alignment(), 4u);
  EXPECT_EQ((*f)->tensors()[1].offset, 12u);
  EXPECT_EQ((*f)->tensors()[2].offset, 16u);
  EXPECT_EQ((*f)->tensors()[2].data,
            reinterpret_cast<const uint8_t*>(bytes.data()) + AlignUp(b.HeaderSize(), 4) + 16);
}

TEST(GgufTest, DefaultAlignmentRejectsOffsetsAlignedOnlyToACustomOne) {
  // Offsets aligned to 16 but no general.alignment key: the default 32 applies.
  GgufBuilder b;
  b.Alignment(16).Tensor("a", {4}).Tensor("b", {4});
  EXPECT_THAT(ParseBytes(b.Build()),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "tensor 'b' offset 16 is not a multiple of the alignment 32"));
}

TEST(GgufTest, VocabularyOnlyFile) {
  const std::string bytes =
      GgufBuilder()
          .Str("general.architecture", "llama")
          .Str("tokenizer.ggml.model", "llama")
          .StrArray("tokenizer.ggml.tokens", {"<unk>", "<s>", "</s>", "a"})
          .Array<float>("tokenizer.ggml.scores", GgufValueType::kFloat32, {0.f, 0.f, 0.f, -1.f})
          .Array<int32_t>("tokenizer.ggml.token_type", GgufValueType::kInt32, {2, 3, 3, 1})
          .U32("tokenizer.ggml.bos_token_id", 1)
          .Build();
  auto f = ParseBytes(bytes);
  PD_ASSERT_OK(f);
  EXPECT_TRUE((*f)->tensors().empty());
  EXPECT_EQ((*f)->file_size(), bytes.size());  // no padding needed after the header
  EXPECT_EQ((*f)->GetStringArray("tokenizer.ggml.tokens")->size(), 4u);
  EXPECT_THAT(*(*f)->GetFloatArray("tokenizer.ggml.scores"), ElementsAre(0.f, 0.f, 0.f, -1.f));
  EXPECT_THAT(*(*f)->GetIntArray("tokenizer.ggml.token_type"), ElementsAre(2, 3, 3, 1));
}

TEST(GgufTest, TensorMayEndExactlyAtEndOfFile) {
  const std::string bytes = GgufBuilder().Tensor("t", {8}).Build();
  auto f = ParseBytes(bytes);
  PD_ASSERT_OK(f);
  const GgufTensorInfo& t = (*f)->tensors()[0];
  EXPECT_EQ(t.data + t.nbytes, reinterpret_cast<const uint8_t*>(bytes.data()) + bytes.size());
}

// ------------------------------------------------------------------------------------------------
// Malformed files
// ------------------------------------------------------------------------------------------------

TEST(GgufMalformedTest, BadMagic) {
  const std::string bytes = GgufBuilder().Magic(0x47475546).Build();  // "FUGG"
  EXPECT_THAT(ParseBytes(bytes), StatusIs(absl::StatusCode::kInvalidArgument, "not a GGUF file"));
  EXPECT_THAT(ParseBytes(bytes), StatusIs(absl::StatusCode::kInvalidArgument, "0x47475546"));
  // A zip file, say.
  EXPECT_THAT(ParseBytes(std::string("PK\x03\x04") + " and more bytes than a GGUF header"),
              StatusIs(absl::StatusCode::kInvalidArgument, "not a GGUF file"));
}

TEST(GgufMalformedTest, EmptyAndTinyInputs) {
  EXPECT_THAT(GgufFile::Parse(MappedFile::Borrow(nullptr, 0)),
              StatusIs(absl::StatusCode::kDataLoss, "magic"));
  EXPECT_THAT(ParseBytes("GG"), StatusIs(absl::StatusCode::kDataLoss, "needs 4 bytes, 2 left"));
  EXPECT_THAT(ParseBytes("GGUF"), StatusIs(absl::StatusCode::kDataLoss, "version"));
}

TEST(GgufMalformedTest, UnsupportedVersions) {
  for (uint32_t v : {0u, 1u, 4u, 0x03000000u /* big-endian v3 */}) {
    const std::string bytes = GgufBuilder(v).Build();
    EXPECT_THAT(ParseBytes(bytes),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         pd::StrCat("unsupported GGUF version ", v, " (supported: 2, 3)")));
  }
}

// Every proper prefix of a valid file must fail with DATA_LOSS, never crash or read past the end.
// Each prefix is copied into a buffer of exactly its size so ASan builds catch over-reads.
void ExpectEveryPrefixFails(const std::string& full) {
  ASSERT_THAT(ParseBytes(full), IsOk());
  for (size_t n = 0; n < full.size(); ++n) {
    std::unique_ptr<uint8_t[]> buf(new uint8_t[n == 0 ? 1 : n]);
    std::memcpy(buf.get(), full.data(), n);
    auto f = GgufFile::Parse(MappedFile::Borrow(buf.get(), n));
    ASSERT_THAT(f, StatusIs(absl::StatusCode::kDataLoss)) << "prefix of " << n << " bytes";
    ASSERT_FALSE(f.status().message().empty());
  }
}

TEST(GgufMalformedTest, TruncationAtEveryByteOffset) { ExpectEveryPrefixFails(RichFile().Build()); }

TEST(GgufMalformedTest, TruncationAtEveryByteOffsetV2CustomAlignment) {
  ExpectEveryPrefixFails(GgufBuilder(2)
                             .Alignment(8)
                             .U32("general.alignment", 8)
                             .Tensor("x", {2}, kTypeF16)
                             .Tensor("y", {3})
                             .Build());
}

TEST(GgufMalformedTest, TruncationOfVocabularyOnlyFile) {
  // Without tensors the file may end right after the metadata; every shorter prefix is cut.
  ExpectEveryPrefixFails(GgufBuilder().StrArray("t", {"a", "bc"}).U8("x", 1).Build());
}

TEST(GgufMalformedTest, TruncatedMessagesSayWhereAndWhat) {
  const std::string full = GgufBuilder().Tensor("t", {8}).Build();
  // Cut in the middle of the tensor data.
  EXPECT_THAT(ParseBytes(full.substr(0, full.size() - 1)),
              StatusIs(absl::StatusCode::kDataLoss, "tensor 't' data [0, +32) lies outside"));
  // Cut right after the header, before the padding.
  const std::string header_only = GgufBuilder().Tensor("t", {8}).OmitData().Build();
  EXPECT_THAT(ParseBytes(header_only),
              StatusIs(absl::StatusCode::kDataLoss, "data section would start at byte"));
}

TEST(GgufMalformedTest, StringLengthOverflowsOrRunsPastEnd) {
  {  // key length 2^64 - 1
    const std::string bytes =
        Bytes().U32(0x46554747).U32(3).U64(0).U64(1).U64(kU64Max).Zeros(16).str();
    EXPECT_THAT(ParseBytes(bytes),
                StatusIs(absl::StatusCode::kDataLoss,
                         "metadata key has length 18446744073709551615 but only 16 bytes remain"));
  }
  {  // key length one past the end
    const std::string bytes =
        Bytes().U32(0x46554747).U32(3).U64(0).U64(1).U64(20).Raw("0123456789abcdefghi", 19).str();
    EXPECT_THAT(ParseBytes(bytes), StatusIs(absl::StatusCode::kDataLoss,
                                            "metadata key has length 20 but only 19 bytes remain"));
  }
  {  // string value whose length is one more than what is left
    const std::string bytes =
        GgufBuilder().Kv("s", GgufValueType::kString, Bytes().U64(6).Raw("hello", 5)).Build();
    EXPECT_THAT(ParseBytes(bytes), StatusIs(absl::StatusCode::kDataLoss, "s has length 6"));
  }
  {  // string value length 2^63
    const std::string bytes =
        GgufBuilder().Kv("s", GgufValueType::kString, Bytes().U64(uint64_t{1} << 63)).Build();
    EXPECT_THAT(ParseBytes(bytes), StatusIs(absl::StatusCode::kDataLoss));
  }
  {  // string inside a string array
    Bytes arr;
    arr.U32(TypeId(GgufValueType::kString)).U64(2).Str("ok").U64(kU64Max - 1);
    const std::string bytes = GgufBuilder().Kv("toks", GgufValueType::kArray, arr).Build();
    EXPECT_THAT(ParseBytes(bytes), StatusIs(absl::StatusCode::kDataLoss, "toks has length"));
  }
  {  // tensor name
    const std::string bytes =
        GgufBuilder().RawTensorInfo(Bytes().U64(uint64_t{1} << 40).Zeros(32)).Build();
    EXPECT_THAT(ParseBytes(bytes), StatusIs(absl::StatusCode::kDataLoss, "tensor name has length"));
  }
}

TEST(GgufMalformedTest, ArrayCountsThatOverflowOrRunPastEnd) {
  struct Case {
    GgufValueType elem;
    uint64_t count;
  };
  // count * element size wraps to 0 (or a small number) for several of these.
  const Case cases[] = {
      {GgufValueType::kUint8, uint64_t{1} << 63},       {GgufValueType::kUint32, uint64_t{1} << 62},
      {GgufValueType::kUint64, uint64_t{1} << 61},      {GgufValueType::kFloat64, kU64Max},
      {GgufValueType::kInt16, (uint64_t{1} << 63) + 1}, {GgufValueType::kBool, uint64_t{1} << 63},
      {GgufValueType::kString, uint64_t{1} << 63},      {GgufValueType::kString, kU64Max / 8 + 1},
      {GgufValueType::kArray, uint64_t{1} << 63},       {GgufValueType::kUint32, 5},  // 4 fit
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(pd::StrCat(GgufValueTypeName(c.elem), " x ", c.count));
    Bytes arr;
    arr.U32(TypeId(c.elem)).U64(c.count).Zeros(16);
    const std::string bytes = GgufBuilder().Kv("arr", GgufValueType::kArray, arr).Build();
    EXPECT_THAT(ParseBytes(bytes),
                StatusIs(absl::StatusCode::kDataLoss,
                         pd::StrCat("'arr': array of ", c.count, " elements runs past the end")));
  }
}

TEST(GgufMalformedTest, HugeCounts) {
  EXPECT_THAT(ParseBytes(GgufBuilder().TensorCount(uint64_t{1} << 40).Build()),
              StatusIs(absl::StatusCode::kInvalidArgument, "tensor count 1099511627776 exceeds"));
  EXPECT_THAT(ParseBytes(GgufBuilder().TensorCount(kU64Max).Build()),
              StatusIs(absl::StatusCode::kInvalidArgument, "tensor count"));
  EXPECT_THAT(
      ParseBytes(GgufBuilder().KvCount(kU64Max).Build()),
      StatusIs(absl::StatusCode::kInvalidArgument, "metadata count 18446744073709551615 exceeds"));
  // Under the cap but more than the remaining bytes could hold: refused before any allocation.
  EXPECT_THAT(ParseBytes(GgufBuilder().TensorCount(1u << 20).Build()),
              StatusIs(absl::StatusCode::kDataLoss,
                       "1048576 tensor infos need at least 33554432 bytes, but only 0 remain"));
  EXPECT_THAT(ParseBytes(GgufBuilder().KvCount(1000).U32("only", 1).Build()),
              StatusIs(absl::StatusCode::kDataLoss,
                       "1000 metadata entries need at least 13000 bytes, but only 20 remain"));
  // Counts the remaining bytes could hold, but the entries are not there.
  EXPECT_THAT(ParseBytes(GgufBuilder().KvCount(2).Str("only", std::string(40, 'v')).Build()),
              StatusIs(absl::StatusCode::kDataLoss, "reading metadata key needs 8 bytes, 0 left"));
  EXPECT_THAT(
      ParseBytes(
          GgufBuilder().TensorCount(2).Tensor(std::string(100, 'n'), {4}).OmitData().Build()),
      StatusIs(absl::StatusCode::kDataLoss, "reading tensor name needs 8 bytes, 0 left"));
}

TEST(GgufMalformedTest, TensorDataOutsideTheFile) {
  // Offset past the end.
  {
    GgufBuilder b;
    b.Tensor("a", {8}).Tensor(TensorSpec{"far", {8}, kTypeF32, uint64_t{1} << 30, std::nullopt});
    EXPECT_THAT(
        ParseBytes(b.Build()),
        StatusIs(absl::StatusCode::kDataLoss, "tensor 'far' data [1073741824, +32) lies outside"));
  }
  // Offset so large that offset + size wraps around.
  {
    GgufBuilder b;
    b.Tensor(TensorSpec{"wrap", {8}, kTypeF32, kU64Max - 31, std::nullopt});
    EXPECT_THAT(ParseBytes(b.Build()), StatusIs(absl::StatusCode::kDataLoss, "'wrap'"));
  }
  // In range, but the last bytes are missing.
  {
    GgufBuilder b;
    b.Tensor(TensorSpec{"short", {8}, kTypeF32, std::nullopt, std::string(31, 'x')});
    EXPECT_THAT(ParseBytes(b.Build()),
                StatusIs(absl::StatusCode::kDataLoss, "[0, +32) lies outside the 31-byte data"));
  }
}

TEST(GgufMalformedTest, MisalignedTensorOffset) {
  GgufBuilder b;
  b.Tensor(TensorSpec{"m", {4}, kTypeF32, 4, std::nullopt});
  EXPECT_THAT(ParseBytes(b.Build()),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "tensor 'm' offset 4 is not a multiple of the alignment 32"));
}

TEST(GgufMalformedTest, OverlappingTensors) {
  {  // a: [0, 64), b: [32, 64)
    GgufBuilder b;
    b.Tensor("a", {16}).Tensor(TensorSpec{"b", {8}, kTypeF32, 32, std::nullopt});
    EXPECT_THAT(ParseBytes(b.Build()),
                StatusIs(absl::StatusCode::kInvalidArgument, "tensors 'a' and 'b' overlap"));
  }
  {  // same offset, listed in reverse order of their offsets
    GgufBuilder b;
    b.Tensor(TensorSpec{"late", {8}, kTypeF32, 64, std::nullopt})
        .Tensor(TensorSpec{"x", {8}, kTypeF32, 0, std::nullopt})
        .Tensor(TensorSpec{"y", {8}, kTypeF32, 0, std::nullopt});
    EXPECT_THAT(ParseBytes(b.Build()), StatusIs(absl::StatusCode::kInvalidArgument, "overlap"));
  }
  {  // adjacent is fine
    GgufBuilder b;
    b.Tensor("a", {8}).Tensor(TensorSpec{"b", {8}, kTypeF32, 32, std::nullopt});
    PD_EXPECT_OK(ParseBytes(b.Build()));
  }
}

TEST(GgufMalformedTest, DuplicateKeys) {
  const std::string bytes = GgufBuilder().U32("dup", 1).Str("other", "x").Str("dup", "y").Build();
  EXPECT_THAT(ParseBytes(bytes),
              StatusIs(absl::StatusCode::kInvalidArgument, "GGUF key 'dup' appears twice"));
}

TEST(GgufMalformedTest, DuplicateTensorNames) {
  GgufBuilder b;
  b.Tensor("w", {8}).Tensor("v", {8}).Tensor("w", {8});
  EXPECT_THAT(ParseBytes(b.Build()),
              StatusIs(absl::StatusCode::kInvalidArgument, "tensor 'w' appears twice"));
}

TEST(GgufMalformedTest, UnknownValueTypes) {
  EXPECT_THAT(
      ParseBytes(GgufBuilder().Kv("k", 13u, Bytes().U64(0)).Build()),
      StatusIs(absl::StatusCode::kInvalidArgument, "GGUF key 'k' has unknown value type 13"));
  EXPECT_THAT(ParseBytes(GgufBuilder().Kv("k", 0xffffffffu, Bytes().U64(0)).Build()),
              StatusIs(absl::StatusCode::kInvalidArgument, "unknown value type 4294967295"));
  EXPECT_THAT(
      ParseBytes(GgufBuilder().Kv("k", GgufValueType::kArray, Bytes().U32(99).U64(0)).Build()),
      StatusIs(absl::StatusCode::kInvalidArgument, "'k': unknown array element type 99"));
}

Bytes TensorInfo(std::string_view name, const std::vector<uint64_t>& dims, uint32_t type,
                 uint64_t offset = 0) {
  Bytes b;
  b.Str(name).U32(static_cast<uint32_t>(dims.size()));
  for (uint64_t d : dims) b.U64(d);
  return b.U32(type).U64(offset);
}

TEST(GgufMalformedTest, UnknownTensorTypeIsNamed) {
  EXPECT_THAT(ParseBytes(GgufBuilder().Tensor("blk.0.ffn_up.weight", {256, 4}, 20).Build()),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "tensor 'blk.0.ffn_up.weight' has type iq4_nl, which this engine does not "
                       "support"));
  EXPECT_THAT(ParseBytes(GgufBuilder().Tensor("t", {32}, 7).Build()),
              StatusIs(absl::StatusCode::kInvalidArgument, "has type q5_1"));
  EXPECT_THAT(ParseBytes(GgufBuilder().Tensor("t", {32}, 200).Build()),
              StatusIs(absl::StatusCode::kInvalidArgument, "has type type 200"));
}

TEST(GgufMalformedTest, DimensionCount) {
  // Zero bytes after each info keep the file long enough for the tensor count.
  const Bytes pad = Bytes().Zeros(32);
  EXPECT_THAT(
      ParseBytes(GgufBuilder()
                     .TensorCount(1)
                     .RawTensorInfo(TensorInfo("z", {}, kTypeF32))
                     .RawTensorInfo(pad)
                     .Build()),
      StatusIs(absl::StatusCode::kInvalidArgument, "tensor 'z' has 0 dimensions (1..4 supported)"));
  EXPECT_THAT(
      ParseBytes(
          GgufBuilder().RawTensorInfo(TensorInfo("five", {1, 1, 1, 1, 1}, kTypeF32)).Build()),
      StatusIs(absl::StatusCode::kInvalidArgument, "tensor 'five' has 5 dimensions"));
  // A dims count of 2^32 - 1 is refused before any dimension is read.
  EXPECT_THAT(ParseBytes(GgufBuilder()
                             .TensorCount(1)
                             .RawTensorInfo(Bytes().Str("many").U32(0xffffffffu))
                             .RawTensorInfo(pad)
                             .Build()),
              StatusIs(absl::StatusCode::kInvalidArgument, "4294967295 dimensions"));
}

TEST(GgufMalformedTest, ZeroAndHugeDimensions) {
  EXPECT_THAT(
      ParseBytes(GgufBuilder().Tensor("t", {4, 0}).Build()),
      StatusIs(absl::StatusCode::kInvalidArgument, "tensor 't' dimension 1 = 0 is out of range"));
  EXPECT_THAT(ParseBytes(GgufBuilder().Tensor("t", {uint64_t{1} << 41}).Build()),
              StatusIs(absl::StatusCode::kInvalidArgument, "dimension 0 = 2199023255552"));
  EXPECT_THAT(ParseBytes(GgufBuilder().Tensor("t", {kU64Max}).Build()),
              StatusIs(absl::StatusCode::kInvalidArgument, "out of range"));
  // Each dimension is plausible, but the product would overflow 64 bits.
  EXPECT_THAT(
      ParseBytes(GgufBuilder().Tensor("t", {1u << 30, 1u << 30, 1u << 30, 1u << 30}).Build()),
      StatusIs(absl::StatusCode::kInvalidArgument, "tensor 't' dimension 1"));
  // Large but legal dimensions only fail later, because the file lacks the data.
  EXPECT_THAT(ParseBytes(GgufBuilder().Tensor("t", {1u << 20, 1u << 20}).OmitData().Build()),
              StatusIs(absl::StatusCode::kDataLoss));
}

TEST(GgufMalformedTest, Q8RowLengthMustBeABlockMultiple) {
  EXPECT_THAT(ParseBytes(GgufBuilder().Tensor("q", {48, 2}, kTypeQ8_0).Build()),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "tensor 'q' of type q8_0 has row length 48, not a multiple of its block "
                       "size 32"));
  // The block rule applies to the row (dim 0) only: [32, 3] is fine.
  PD_EXPECT_OK(ParseBytes(GgufBuilder().Tensor("q", {32, 3}, kTypeQ8_0).Build()));
}

TEST(GgufMalformedTest, BadAlignment) {
  for (uint32_t a : {0u, 3u, 48u, 1u << 21}) {
    SCOPED_TRACE(a);
    EXPECT_THAT(ParseBytes(GgufBuilder().U32("general.alignment", a).Build()),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         pd::StrCat("general.alignment ", a, " is not a power of two")));
  }
  EXPECT_THAT(ParseBytes(GgufBuilder().Str("general.alignment", "32").Build()),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "GGUF key 'general.alignment' has type string, expected uint32"));
  EXPECT_THAT(ParseBytes(GgufBuilder().F32("general.alignment", 32.f).Build()),
              StatusIs(absl::StatusCode::kInvalidArgument, "has type float32"));
  EXPECT_THAT(ParseBytes(GgufBuilder().I32("general.alignment", 32).Build()),
              StatusIs(absl::StatusCode::kInvalidArgument, "has type int32"));
  // Powers of two from 1 to 1 MiB are accepted.
  for (uint32_t a : {1u, 2u, 8u, 1u << 20}) {
    auto f = ParseBytes(GgufBuilder().U32("general.alignment", a).Build());
    PD_ASSERT_OK(f);
    EXPECT_EQ((*f)->alignment(), a);
  }
}

TEST(GgufMalformedTest, BoolMustBe0Or1) {
  EXPECT_THAT(ParseBytes(GgufBuilder().Kv("b", GgufValueType::kBool, Bytes().U8(2)).Build()),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "GGUF key 'b': bool value 2 is neither 0 nor 1"));
  EXPECT_THAT(
      ParseBytes(GgufBuilder().Array<uint8_t>("ba", GgufValueType::kBool, {0, 1, 255}).Build()),
      StatusIs(absl::StatusCode::kInvalidArgument, "'ba': bool element 2 is neither"));
}

// ------------------------------------------------------------------------------------------------
// Typed getters
// ------------------------------------------------------------------------------------------------

class GgufGetterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    bytes_ = GgufBuilder()
                 .U8("u8", 7)
                 .I32("neg", -4)
                 .I32("pos", 4)
                 .I8("neg8", -1)
                 .U64("big", kU64Max)
                 .I64("min", std::numeric_limits<int64_t>::min())
                 .F32("f", 0.75f)
                 .F64("d", 1e300)
                 .Bool("b", true)
                 .Str("s", "text")
                 .StrArray("sa", {"x", "y"})
                 .Array<float>("fa", GgufValueType::kFloat32, {1.f, 2.f})
                 .Array<uint64_t>("ua", GgufValueType::kUint64, {1, kU64Max})
                 .Build();
    auto f = ParseBytes(bytes_);
    ASSERT_THAT(f, IsOk());
    f_ = std::move(*f);
  }
  std::string bytes_;
  std::unique_ptr<GgufFile> f_;
};

TEST_F(GgufGetterTest, GetUint) {
  EXPECT_EQ(*f_->GetUint("u8"), 7u);
  EXPECT_EQ(*f_->GetUint("pos"), 4u);  // a non-negative signed value is fine
  EXPECT_EQ(*f_->GetUint("big"), kU64Max);
  EXPECT_THAT(f_->GetUint("neg"), StatusIs(absl::StatusCode::kInvalidArgument,
                                           "GGUF key 'neg' is -4, expected a non-negative value"));
  EXPECT_THAT(f_->GetUint("neg8"), StatusIs(absl::StatusCode::kInvalidArgument, "is -1"));
  EXPECT_THAT(f_->GetUint("min"), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(f_->GetUint("f"), StatusIs(absl::StatusCode::kInvalidArgument,
                                         "GGUF key 'f' has type float32, expected an integer"));
  EXPECT_THAT(f_->GetUint("b"), StatusIs(absl::StatusCode::kInvalidArgument, "has type bool"));
  EXPECT_THAT(f_->GetUint("s"), StatusIs(absl::StatusCode::kInvalidArgument, "has type string"));
  EXPECT_THAT(f_->GetUint("fa"), StatusIs(absl::StatusCode::kInvalidArgument, "has type array"));
  EXPECT_THAT(f_->GetUint("absent"),
              StatusIs(absl::StatusCode::kNotFound, "GGUF key 'absent' is missing"));
}

TEST_F(GgufGetterTest, GetInt) {
  EXPECT_EQ(*f_->GetInt("u8"), 7);
  EXPECT_EQ(*f_->GetInt("neg"), -4);
  EXPECT_EQ(*f_->GetInt("neg8"), -1);
  EXPECT_EQ(*f_->GetInt("min"), std::numeric_limits<int64_t>::min());
  EXPECT_THAT(f_->GetInt("big"),
              StatusIs(absl::StatusCode::kInvalidArgument, "GGUF key 'big' is out of range"));
  EXPECT_THAT(f_->GetInt("d"), StatusIs(absl::StatusCode::kInvalidArgument, "has type float64"));
  EXPECT_THAT(f_->GetInt("absent"), StatusIs(absl::StatusCode::kNotFound));
}

TEST_F(GgufGetterTest, GetFloat) {
  EXPECT_EQ(*f_->GetFloat("f"), 0.75);
  EXPECT_EQ(*f_->GetFloat("d"), 1e300);
  EXPECT_EQ(*f_->GetFloat("u8"), 7.0);
  EXPECT_EQ(*f_->GetFloat("neg"), -4.0);
  EXPECT_EQ(*f_->GetFloat("big"), 18446744073709551615.0);
  EXPECT_THAT(f_->GetFloat("s"),
              StatusIs(absl::StatusCode::kInvalidArgument, "has type string, expected a number"));
  EXPECT_THAT(f_->GetFloat("b"), StatusIs(absl::StatusCode::kInvalidArgument, "has type bool"));
  EXPECT_THAT(f_->GetFloat("absent"), StatusIs(absl::StatusCode::kNotFound));
}

TEST_F(GgufGetterTest, GetBoolAndString) {
  EXPECT_EQ(*f_->GetBool("b"), true);
  EXPECT_THAT(f_->GetBool("u8"),
              StatusIs(absl::StatusCode::kInvalidArgument, "has type uint8, expected bool"));
  EXPECT_THAT(f_->GetBool("absent"), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_EQ(*f_->GetString("s"), "text");
  EXPECT_THAT(f_->GetString("u8"),
              StatusIs(absl::StatusCode::kInvalidArgument, "has type uint8, expected string"));
  EXPECT_THAT(f_->GetString("sa"), StatusIs(absl::StatusCode::kInvalidArgument, "has type array"));
  EXPECT_THAT(f_->GetString("absent"), StatusIs(absl::StatusCode::kNotFound, "'absent'"));
}

TEST_F(GgufGetterTest, ArrayGetters) {
  EXPECT_THAT(*f_->GetStringArray("sa"), ElementsAre("x", "y"));
  EXPECT_THAT(f_->GetStringArray("fa"),
              StatusIs(absl::StatusCode::kInvalidArgument, "expected array of string"));
  EXPECT_THAT(f_->GetStringArray("s"), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(f_->GetStringArray("absent"), StatusIs(absl::StatusCode::kNotFound));

  EXPECT_THAT(*f_->GetFloatArray("fa"), ElementsAre(1.f, 2.f));
  EXPECT_THAT(f_->GetFloatArray("sa"),
              StatusIs(absl::StatusCode::kInvalidArgument, "expected array of numbers"));
  EXPECT_THAT(f_->GetFloatArray("f"), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(f_->GetFloatArray("absent"), StatusIs(absl::StatusCode::kNotFound));

  EXPECT_THAT(f_->GetIntArray("fa"),
              StatusIs(absl::StatusCode::kInvalidArgument, "expected array of integers"));
  EXPECT_THAT(f_->GetIntArray("ua"),
              StatusIs(absl::StatusCode::kInvalidArgument, "'ua' element 1 is out of range"));
  EXPECT_THAT(f_->GetIntArray("u8"), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(f_->GetIntArray("absent"), StatusIs(absl::StatusCode::kNotFound));
}

TEST_F(GgufGetterTest, OrVariants) {
  EXPECT_EQ(*f_->GetUintOr("absent", 42), 42u);
  EXPECT_EQ(*f_->GetUintOr("u8", 42), 7u);
  EXPECT_THAT(f_->GetUintOr("neg", 42), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(f_->GetUintOr("s", 42), StatusIs(absl::StatusCode::kInvalidArgument));

  EXPECT_EQ(*f_->GetFloatOr("absent", 0.5), 0.5);
  EXPECT_EQ(*f_->GetFloatOr("f", 0.5), 0.75);
  EXPECT_THAT(f_->GetFloatOr("s", 0.5), StatusIs(absl::StatusCode::kInvalidArgument));

  EXPECT_EQ(*f_->GetBoolOr("absent", true), true);
  EXPECT_EQ(*f_->GetBoolOr("absent", false), false);
  EXPECT_EQ(*f_->GetBoolOr("b", false), true);
  EXPECT_THAT(f_->GetBoolOr("u8", false), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(GgufTest, ValueTypeNames) {
  EXPECT_EQ(GgufValueTypeName(GgufValueType::kUint8), "uint8");
  EXPECT_EQ(GgufValueTypeName(GgufValueType::kBool), "bool");
  EXPECT_EQ(GgufValueTypeName(GgufValueType::kArray), "array");
  EXPECT_EQ(GgufValueTypeName(GgufValueType::kFloat64), "float64");
  EXPECT_EQ(GgufValueTypeName(static_cast<GgufValueType>(13)), "unknown");
}

// ------------------------------------------------------------------------------------------------
// Path API
// ------------------------------------------------------------------------------------------------

class GgufOpenTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = pd::StrCat(::testing::TempDir(), "gguf_test_", getpid(), "_",
                      ::testing::UnitTest::GetInstance()->current_test_info()->name());
    ASSERT_EQ(::mkdir(dir_.c_str(), 0700), 0) << dir_;
  }
  void TearDown() override {
    for (const std::string& p : written_) ::unlink(p.c_str());
    ::rmdir(dir_.c_str());
  }
  std::string Write(const std::string& name, const std::string& bytes) {
    const std::string path = dir_ + "/" + name;
    std::ofstream(path, std::ios::binary) << bytes;
    written_.push_back(path);
    return path;
  }
  std::string dir_;
  std::vector<std::string> written_;
};

TEST_F(GgufOpenTest, OpensAValidFile) {
  GgufBuilder b;
  b.Str("general.name", "tiny").Tensor("t", {8, 2});
  const std::string path = Write("ok.gguf", b.Build());
  auto f = GgufFile::Open(path);
  PD_ASSERT_OK(f);
  EXPECT_EQ(*(*f)->GetString("general.name"), "tiny");
  const GgufTensorInfo* t = (*f)->FindTensor("t");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->nbytes, 64u);
  // Mapped from the file: the data lies at the data start of a page-aligned map.
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t->data) % 32, 0u);
  EXPECT_EQ(static_cast<char>(t->data[63]), GgufBuilder::PatternByte(0, 63));
}

// DropPages (for tensor bytes a backend copied) leaves the file's bytes readable and unchanged:
// whole pages inside the range are dropped and fault in again from the file; ranges outside the
// map, empty ranges and borrowed (unmapped) bytes are no-ops.
TEST_F(GgufOpenTest, DroppedPagesReadBackUnchanged) {
  GgufBuilder b;
  b.Tensor("big", {4096, 8}).Tensor("small", {8, 2});  // 128 KiB of F32: many whole pages
  const std::string bytes = b.Build();
  const std::string path = Write("drop.gguf", bytes);
  auto f = GgufFile::Open(path);
  PD_ASSERT_OK(f);
  const GgufTensorInfo* big = (*f)->FindTensor("big");
  const GgufTensorInfo* small = (*f)->FindTensor("small");
  ASSERT_NE(big, nullptr);
  ASSERT_NE(small, nullptr);
  const std::vector<uint8_t> before(big->data, big->data + big->nbytes);
  (*f)->DropPages(big->data, big->nbytes);
  EXPECT_EQ(std::vector<uint8_t>(big->data, big->data + big->nbytes), before);
  EXPECT_EQ(static_cast<char>(small->data[63]), GgufBuilder::PatternByte(1, 63));
  int outside = 0;
  (*f)->DropPages(&outside, sizeof(outside));  // not in the map
  (*f)->DropPages(big->data, 0);
  (*f)->DropPages(big->data, (*f)->file_size() * 2);  // runs past the end: ignored
  EXPECT_EQ(outside, 0);
  EXPECT_EQ(std::vector<uint8_t>(big->data, big->data + big->nbytes), before);
  // Borrowed bytes are never dropped: a heap copy keeps its contents.
  std::vector<char> heap(bytes.begin(), bytes.end());
  auto borrowed = GgufFile::Parse(MappedFile::Borrow(heap.data(), heap.size()));
  PD_ASSERT_OK(borrowed);
  const GgufTensorInfo* hb = (*borrowed)->FindTensor("big");
  (*borrowed)->DropPages(hb->data, hb->nbytes);
  EXPECT_EQ(std::vector<uint8_t>(hb->data, hb->data + hb->nbytes), before);
}

TEST_F(GgufOpenTest, MissingFileIsNotFound) {
  EXPECT_THAT(GgufFile::Open(dir_ + "/missing.gguf"),
              StatusIs(absl::StatusCode::kNotFound, "missing.gguf"));
}

TEST_F(GgufOpenTest, DirectoryIsInvalidArgument) {
  EXPECT_THAT(GgufFile::Open(dir_),
              StatusIs(absl::StatusCode::kInvalidArgument, "is not a regular file"));
}

TEST_F(GgufOpenTest, EmptyFileIsDataLoss) {
  const std::string path = Write("empty.gguf", "");
  EXPECT_THAT(GgufFile::Open(path), StatusIs(absl::StatusCode::kDataLoss, "empty.gguf"));
}

TEST_F(GgufOpenTest, ErrorsNameThePath) {
  const std::string path = Write("bad.gguf", GgufBuilder(1).Build());
  EXPECT_THAT(GgufFile::Open(path),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       pd::StrCat("'", path, "': unsupported GGUF version 1")));
}

}  // namespace
}  // namespace pd::engine
