// The GGUF writer (engine/quant/quantize/gguf_writer.h): what it writes our reader loads with the
// same metadata (every value type, arrays included), tensor types, shapes, offsets and bytes; the
// temporary file is renamed only on Commit and removed otherwise.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <vector>

#include "common/status_matchers.h"
#include "engine/quant/quantize/gguf_writer.h"
#include "tests/testing/gguf_builder.h"

namespace pd::engine::quantize {
namespace {

using ::pd::testing::StatusIs;
namespace t = ::pd::engine::testing;

bool Exists(const std::string& p) { return std::filesystem::exists(p); }

TEST(GgufWriterTest, RoundTripsMetadataAndTensors) {
  // A source file with every metadata type.
  t::GgufBuilder b;
  b.Str("general.architecture", "llama")
      .U8("k.u8", 200)
      .I8("k.i8", -5)
      .U16("k.u16", 60000)
      .I16("k.i16", -30000)
      .U32("k.u32", 4000000000u)
      .I32("k.i32", -2000000000)
      .F32("k.f32", 0.1f)
      .U64("k.u64", 1ull << 60)
      .I64("k.i64", -(1ll << 60))
      .F64("k.f64", 1.0 / 3)
      .Bool("k.b", true)
      .Str("k.str", std::string("bytes\0with nul", 14))
      .Array<float>("k.af32", GgufValueType::kFloat32, {1.5f, -2.f})
      .Array<int32_t>("k.ai32", GgufValueType::kInt32, {1, -2, 3})
      .Array<uint8_t>("k.abool", GgufValueType::kBool, {1, 0})
      .StrArray("k.astr", {"a", "", "ccc"});
  const std::string src_bytes = b.Build();
  auto src = t::ParseBytes(src_bytes);
  PD_ASSERT_OK(src);

  GgufWriter w;
  for (const auto& [key, value] : (*src)->metadata()) PD_ASSERT_OK(w.CopyKv(key, value));
  w.SetU32("general.file_type", 15);
  w.SetU32("k.u32", 7);  // replaces in place
  w.SetString("general.name", "q");
  std::vector<float> norm = {1, 2, 3};
  std::vector<uint8_t> q8(34 * 4, 0x11);
  const size_t i_norm = w.AddTensor("norm", DType::kF32, {3});
  const size_t i_q8 = w.AddTensor("w", DType::kQ8_0, {64, 2});
  EXPECT_EQ(w.TensorBytes(i_q8), 136u);

  const std::string path = ::testing::TempDir() + "/writer_test.gguf";
  std::filesystem::remove(path);
  PD_ASSERT_OK(w.Open(path));
  EXPECT_TRUE(Exists(path + ".tmp"));
  EXPECT_FALSE(Exists(path));
  PD_ASSERT_OK(w.WriteTensor(i_q8, q8.data(), q8.size()));  // any order
  PD_ASSERT_OK(w.WriteTensor(i_norm, norm.data(), 12));
  PD_ASSERT_OK(w.Commit());
  EXPECT_FALSE(Exists(path + ".tmp"));
  EXPECT_EQ(std::filesystem::file_size(path), w.FileSize());
  EXPECT_EQ(w.FileSize() % 32, 0u);

  auto out = GgufFile::Open(path);
  PD_ASSERT_OK(out);
  EXPECT_EQ((*out)->version(), 3u);
  EXPECT_EQ((*out)->alignment(), 32u);
  for (const auto& [key, v] : (*src)->metadata()) {
    const GgufValue* o = (*out)->Find(key);
    ASSERT_NE(o, nullptr) << key;
    if (key == "k.u32") continue;
    EXPECT_EQ(o->type, v.type) << key;
    EXPECT_EQ(o->i, v.i) << key;
    EXPECT_EQ(o->u, v.u) << key;
    EXPECT_EQ(o->f, v.f) << key;
    EXPECT_EQ(o->str, v.str) << key;
    EXPECT_EQ(o->elem_type, v.elem_type) << key;
    EXPECT_EQ(o->count, v.count) << key;
    EXPECT_EQ(o->strings, v.strings) << key;
  }
  EXPECT_EQ(*(*out)->GetUint("k.u32"), 7u);
  EXPECT_EQ(*(*out)->GetUint("general.file_type"), 15u);
  EXPECT_EQ(*(*out)->GetString("general.name"), "q");
  EXPECT_EQ((*out)->metadata().size(), (*src)->metadata().size() + 2);
  EXPECT_EQ(*(*out)->GetFloatArray("k.af32"), (std::vector<float>{1.5f, -2.f}));
  EXPECT_EQ(*(*out)->GetIntArray("k.ai32"), (std::vector<int64_t>{1, -2, 3}));

  ASSERT_EQ((*out)->tensors().size(), 2u);
  const GgufTensorInfo* tn = (*out)->FindTensor("norm");
  const GgufTensorInfo* tw = (*out)->FindTensor("w");
  ASSERT_TRUE(tn && tw);
  EXPECT_EQ(tn->type, DType::kF32);
  EXPECT_EQ(tn->shape, (std::vector<int64_t>{3}));
  EXPECT_EQ(tw->type, DType::kQ8_0);
  EXPECT_EQ(tw->shape, (std::vector<int64_t>{64, 2}));
  EXPECT_EQ(tw->offset % 32, 0u);
  EXPECT_EQ(std::memcmp(tn->data, norm.data(), 12), 0);
  EXPECT_EQ(std::memcmp(tw->data, q8.data(), q8.size()), 0);
  std::filesystem::remove(path);
}

TEST(GgufWriterTest, SettersWriteTheirTypes) {
  GgufWriter w;
  w.SetF32("k.f32", 0.25f);
  w.SetBool("k.yes", true);
  w.SetBool("k.no", false);
  w.SetF32Array("k.af32", {1.5f, -2.f, 0.f});
  w.SetStringArray("k.astr", {"a", "", std::string("n\0ul", 4), "\xE2\x96\x81x"});
  w.SetF32Array("k.empty", {});
  w.SetF32("k.f32", -3.f);  // replaces in place
  const std::string path = ::testing::TempDir() + "/writer_setters.gguf";
  PD_ASSERT_OK(w.Open(path));
  PD_ASSERT_OK(w.Commit());
  auto out = GgufFile::Open(path);
  PD_ASSERT_OK(out);
  EXPECT_EQ((*out)->Find("k.f32")->type, GgufValueType::kFloat32);
  EXPECT_EQ(*(*out)->GetFloat("k.f32"), -3.0);
  EXPECT_EQ((*out)->Find("k.yes")->type, GgufValueType::kBool);
  EXPECT_TRUE(*(*out)->GetBool("k.yes"));
  EXPECT_FALSE(*(*out)->GetBool("k.no"));
  EXPECT_EQ((*out)->Find("k.af32")->elem_type, GgufValueType::kFloat32);
  EXPECT_EQ(*(*out)->GetFloatArray("k.af32"), (std::vector<float>{1.5f, -2.f, 0.f}));
  EXPECT_TRUE((*out)->GetFloatArray("k.empty")->empty());
  EXPECT_EQ((*out)->Find("k.astr")->elem_type, GgufValueType::kString);
  auto strs = (*out)->GetStringArray("k.astr");
  PD_ASSERT_OK(strs);
  EXPECT_EQ(*strs, (std::vector<std::string_view>{"a", "", std::string_view("n\0ul", 4),
                                                  "\xE2\x96\x81x"}));
  EXPECT_EQ((*out)->metadata().size(), 6u);
  std::filesystem::remove(path);
}

TEST(GgufWriterTest, TensorsCanBeWrittenInParts) {
  GgufWriter w;
  const size_t a = w.AddTensor("a", DType::kF32, {5});
  const size_t b = w.AddTensor("b", DType::kF32, {4, 3});
  std::vector<float> va = {1, 2, 3, 4, 5}, vb(12);
  for (int i = 0; i < 12; ++i) vb[i] = 10.f + i;
  const std::string path = ::testing::TempDir() + "/writer_parts.gguf";
  PD_ASSERT_OK(w.Open(path));
  // b's rows out of order, a whole.
  PD_ASSERT_OK(w.WriteTensorPart(b, 32, vb.data() + 8, 16));
  PD_ASSERT_OK(w.WriteTensorPart(b, 0, vb.data(), 32));
  PD_ASSERT_OK(w.WriteTensorPart(a, 0, va.data(), 20));
  PD_ASSERT_OK(w.Commit());
  auto out = GgufFile::Open(path);
  PD_ASSERT_OK(out);
  EXPECT_EQ(std::memcmp((*out)->FindTensor("a")->data, va.data(), 20), 0);
  EXPECT_EQ(std::memcmp((*out)->FindTensor("b")->data, vb.data(), 48), 0);
  std::filesystem::remove(path);
}

TEST(GgufWriterTest, InMemoryFilesParseAndLeaveNoPath) {
  GgufWriter w;
  w.SetString("general.architecture", "llama");
  const size_t a = w.AddTensor("a", DType::kF32, {3});
  const size_t b = w.AddTensor("b", DType::kF16, {40});  // its end is padded to the alignment
  const float va[3] = {1.5f, -2.f, 7.f};
  std::vector<uint16_t> vb(40, 0x3C00);
  PD_ASSERT_OK(w.OpenMemory("writer-test"));
  EXPECT_EQ(w.tmp_path(), "writer-test");
  PD_ASSERT_OK(w.WriteTensor(b, vb.data(), vb.size() * 2));
  PD_ASSERT_OK(w.WriteTensorPart(a, 4, va + 1, 8));
  PD_ASSERT_OK(w.WriteTensorPart(a, 0, va, 4));
  absl::StatusOr<MappedFile> map = w.CommitToMemory();
  PD_ASSERT_OK(map);
  EXPECT_EQ(map->size(), w.FileSize());
  EXPECT_FALSE(Exists("writer-test")) << "an in-memory file has no path";
  auto out = GgufFile::Parse(std::move(*map));
  PD_ASSERT_OK(out);
  EXPECT_EQ(*(*out)->GetString("general.architecture"), "llama");
  EXPECT_EQ(std::memcmp((*out)->FindTensor("a")->data, va, 12), 0);
  EXPECT_EQ(std::memcmp((*out)->FindTensor("b")->data, vb.data(), 80), 0);
}

TEST(GgufWriterDeathTest, PartsOutsideTheirTensorAreRefused) {
  GgufWriter w;
  const size_t a = w.AddTensor("a", DType::kF32, {4});
  const std::string path = ::testing::TempDir() + "/writer_part_range.gguf";
  PD_ASSERT_OK(w.Open(path));
  const float x[4] = {};
  EXPECT_DEATH((void)w.WriteTensorPart(a, 8, x, 12), "out of range");
}

TEST(GgufWriterTest, NothingIsLeftWithoutCommit) {
  const std::string path = ::testing::TempDir() + "/writer_abandon.gguf";
  {
    GgufWriter w;
    w.SetU32("a", 1);
    w.AddTensor("x", DType::kF32, {4});
    PD_ASSERT_OK(w.Open(path));
    EXPECT_TRUE(Exists(path + ".tmp"));
  }  // destroyed without Commit
  EXPECT_FALSE(Exists(path + ".tmp"));
  EXPECT_FALSE(Exists(path));
}

TEST(GgufWriterTest, UnwritableDestinationsAreClearErrors) {
  GgufWriter w;
  w.AddTensor("x", DType::kF32, {4});
  EXPECT_THAT(w.Open("/nonexistent-dir/x.gguf"),
              StatusIs(absl::StatusCode::kNotFound, "/nonexistent-dir/x.gguf.tmp"));
  if (::geteuid() != 0) {
    const std::string dir = ::testing::TempDir() + "/readonly_dir";
    std::filesystem::create_directories(dir);
    ::chmod(dir.c_str(), 0555);
    GgufWriter w2;
    w2.AddTensor("x", DType::kF32, {4});
    EXPECT_THAT(w2.Open(dir + "/x.gguf"), StatusIs(absl::StatusCode::kPermissionDenied));
    ::chmod(dir.c_str(), 0755);
  }
}

}  // namespace
}  // namespace pd::engine::quantize
