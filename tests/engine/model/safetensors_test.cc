#include "engine/model/safetensors.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <limits>
#include <memory>
#include <string>
#include <system_error>
#include <vector>

#include "common/status_matchers.h"
#include "common/strings.h"

namespace pd::engine {
namespace {

using ::pd::testing::IsOk;
using ::pd::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// ------------------------------------------------------------------------------------------------
// Building files
// ------------------------------------------------------------------------------------------------

// The bytes of a safetensors file: `header`'s length as a little-endian u64, `header` as is,
// then `data`.
std::string FileBytes(std::string_view header, std::string_view data = {}) {
  std::string out(8, '\0');
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  out.append(header);
  out.append(data);
  return out;
}

// Little-endian bytes of `values`.
template <typename T>
std::string Le(std::initializer_list<T> values) {
  std::string out;
  for (T v : values) {
    char b[sizeof(T)];
    std::memcpy(b, &v, sizeof(T));
    out.append(b, sizeof(T));
  }
  return out;
}

std::string JsonInts(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) absl::StrAppend(&s, i ? "," : "", v[i]);
  return s + "]";
}

// A file built tensor by tensor: each tensor's bytes follow the previous one's in the data buffer,
// its data_offsets say so. Entry() writes an entry's JSON by hand, for broken ones.
class Builder {
 public:
  Builder& Add(const std::string& name, const std::string& dtype, const std::vector<int64_t>& shape,
               const std::string& bytes) {
    const size_t begin = data_.size();
    return Entry(name,
                 pd::StrCat(R"({"dtype":")", dtype, R"(","shape":)", JsonInts(shape),
                            R"(,"data_offsets":[)", begin, ",", begin + bytes.size(), "]}"),
                 bytes);
  }
  // An entry whose JSON is `json` verbatim; `bytes` go into the data buffer.
  Builder& Entry(const std::string& name, const std::string& json, const std::string& bytes = "") {
    entries_.push_back(pd::StrCat("\"", name, "\":", json));
    data_ += bytes;
    return *this;
  }
  Builder& Meta(const std::string& json_object) {
    entries_.insert(entries_.begin(), pd::StrCat(R"("__metadata__":)", json_object));
    return *this;
  }
  // Bytes after the last tensor.
  Builder& Data(const std::string& bytes) {
    data_ += bytes;
    return *this;
  }
  std::string Header() const {
    std::string h = "{";
    for (size_t i = 0; i < entries_.size(); ++i) absl::StrAppend(&h, i ? "," : "", entries_[i]);
    return h + "}";
  }
  const std::string& data() const { return data_; }
  std::string Build() const { return FileBytes(Header(), data_); }

 private:
  std::vector<std::string> entries_;
  std::string data_;
};

constexpr char kName[] = "m.safetensors";

// Parses `bytes`, which the caller keeps alive while the result lives.
absl::StatusOr<std::unique_ptr<SafetensorsFile>> ParseBytes(const std::string& bytes) {
  return SafetensorsFile::Parse(MappedFile::Borrow(bytes.data(), bytes.size()), kName);
}

// The error of parsing a file with `header` (JSON) and `data`.
absl::Status ParseError(std::string_view header, std::string_view data = {}) {
  const std::string bytes = FileBytes(header, data);
  return ParseBytes(bytes).status();
}

// A one-tensor header whose entry is `entry`, over `data`.
absl::Status EntryError(const std::string& entry, const std::string& data = "") {
  return ParseError(pd::StrCat(R"({"t":)", entry, "}"), data);
}

std::string Zeros(size_t n) { return std::string(n, '\0'); }

// ------------------------------------------------------------------------------------------------
// Valid files
// ------------------------------------------------------------------------------------------------

TEST(SafetensorsTest, RoundTripsTensorsAndMetadata) {
  Builder b;
  b.Meta(R"({"format":"pt","note":"caf\u00e9"})")
      .Add("model.embed_tokens.weight", "F32", {2, 3}, Le<float>({0, 1, 2, 3, 4, 5}))
      .Add("model.norm.weight", "BF16", {3}, Le<uint16_t>({0x3f80, 0xc000, 0x3f00}))
      .Add("lm_head.weight", "F16", {2, 2}, Le<uint16_t>({0x3c00, 0x4000, 0x4200, 0x4400}))
      .Add("ids", "I64", {2}, Le<int64_t>({7, -1}))
      .Add("mask", "BOOL", {3}, std::string("\x01\x00\x01", 3));
  const std::string bytes = b.Build();
  auto parsed = ParseBytes(bytes);
  PD_ASSERT_OK(parsed);
  const SafetensorsFile& f = **parsed;

  EXPECT_EQ(f.name(), kName);
  EXPECT_EQ(f.file_size(), bytes.size());
  EXPECT_EQ(f.header_size(), b.Header().size());
  EXPECT_EQ(f.data_start(), 8 + b.Header().size());
  EXPECT_EQ(f.header(), b.Header());
  EXPECT_THAT(f.metadata(),
              ElementsAre(std::pair<const std::string, std::string>("format", "pt"),
                          std::pair<const std::string, std::string>("note", "caf\xc3\xa9")));
  ASSERT_EQ(f.tensors().size(), 5u);

  const SafetensorsTensor* e = f.Find("model.embed_tokens.weight");
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->name, "model.embed_tokens.weight");
  EXPECT_EQ(e->dtype, "F32");
  EXPECT_EQ(e->type, DType::kF32);
  EXPECT_THAT(e->shape, ElementsAre(2, 3));
  EXPECT_EQ(e->numel(), 6);
  EXPECT_EQ(e->offset, 0u);
  EXPECT_EQ(e->nbytes, 24u);
  EXPECT_EQ(e->file, kName);
  EXPECT_EQ(e->data, reinterpret_cast<const uint8_t*>(bytes.data()) + f.data_start());
  float x[6];
  std::memcpy(x, e->data, sizeof(x));
  EXPECT_THAT(x, ElementsAre(0, 1, 2, 3, 4, 5));

  const SafetensorsTensor* n = f.Find("model.norm.weight");
  ASSERT_NE(n, nullptr);
  EXPECT_EQ(n->type, DType::kBF16);
  EXPECT_EQ(n->offset, 24u);
  EXPECT_EQ(n->nbytes, 6u);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(n->data), 6),
            Le<uint16_t>({0x3f80, 0xc000, 0x3f00}));

  const SafetensorsTensor* h = f.Find("lm_head.weight");
  ASSERT_NE(h, nullptr);
  EXPECT_EQ(h->type, DType::kF16);
  EXPECT_EQ(h->offset, 30u);  // not a multiple of 2 or 4 from the map's start: the format allows it
  EXPECT_EQ(h->nbytes, 8u);

  const SafetensorsTensor* ids = f.Find("ids");
  ASSERT_NE(ids, nullptr);
  EXPECT_EQ(ids->dtype, "I64");
  EXPECT_EQ(ids->type, std::nullopt);
  int64_t iv[2];
  std::memcpy(iv, ids->data, sizeof(iv));
  EXPECT_THAT(iv, ElementsAre(7, -1));

  const SafetensorsTensor* mask = f.Find("mask");
  ASSERT_NE(mask, nullptr);
  EXPECT_EQ(mask->dtype, "BOOL");
  EXPECT_EQ(mask->type, std::nullopt);
  EXPECT_EQ(mask->nbytes, 3u);
  EXPECT_EQ(mask->offset + mask->nbytes, b.data().size());

  EXPECT_EQ(f.Find("missing"), nullptr);
  EXPECT_EQ(f.Find("ids "), nullptr);
}

TEST(SafetensorsTest, TensorsAreSortedByOffsetWhateverTheHeaderOrder) {
  const std::string bytes = Builder()
                                .Entry("z", R"({"dtype":"U8","shape":[2],"data_offsets":[0,2]})")
                                .Entry("a", R"({"data_offsets":[4,6],"shape":[2],"dtype":"U8"})")
                                .Entry("m", R"({"shape":[2],"dtype":"U8","data_offsets":[2,4]})")
                                .Data("abcdef")
                                .Build();
  auto f = ParseBytes(bytes);
  PD_ASSERT_OK(f);
  std::vector<std::string> names;
  for (const SafetensorsTensor& t : (*f)->tensors()) names.push_back(t.name);
  EXPECT_THAT(names, ElementsAre("z", "m", "a"));
  EXPECT_EQ(std::string(reinterpret_cast<const char*>((*f)->Find("a")->data), 2), "ef");
  EXPECT_EQ(std::string(reinterpret_cast<const char*>((*f)->Find("m")->data), 2), "cd");
}

TEST(SafetensorsTest, EmptyHeaderWithoutDataParses) {
  for (const char* header : {"{}", "{}      ", " \n{ } ", R"({"__metadata__":{}})"}) {
    const std::string bytes = FileBytes(header);
    auto f = ParseBytes(bytes);
    PD_ASSERT_OK(f) << header;
    EXPECT_TRUE((*f)->tensors().empty());
    EXPECT_TRUE((*f)->metadata().empty());
  }
}

TEST(SafetensorsTest, ScalarsAndEmptyTensors) {
  const std::string bytes =
      Builder()
          .Entry("empty_first", R"({"dtype":"F32","shape":[0,4],"data_offsets":[0,0]})")
          .Add("scalar", "F64", {}, Le<double>({2.5}))
          .Entry("empty_mid", R"({"dtype":"BF16","shape":[3,0],"data_offsets":[8,8]})")
          .Add("one", "I32", {1, 1, 1}, Le<int32_t>({-4}))
          .Entry("empty_end", R"({"dtype":"I8","shape":[0],"data_offsets":[12,12]})")
          .Build();
  auto f = ParseBytes(bytes);
  PD_ASSERT_OK(f);
  ASSERT_EQ((*f)->tensors().size(), 5u);
  const SafetensorsTensor* s = (*f)->Find("scalar");
  EXPECT_TRUE(s->shape.empty());
  EXPECT_EQ(s->numel(), 1);
  EXPECT_EQ(s->nbytes, 8u);
  EXPECT_EQ((*f)->Find("empty_mid")->numel(), 0);
  EXPECT_EQ((*f)->Find("empty_mid")->nbytes, 0u);
  EXPECT_EQ((*f)->Find("empty_mid")->offset, 8u);
  EXPECT_EQ((*f)->Find("empty_end")->offset, 12u);
  EXPECT_EQ((*f)->Find("one")->numel(), 1);
}

TEST(SafetensorsTest, EveryDtypeHasItsElementSize) {
  struct Case {
    const char* dtype;
    size_t bits;
  };
  const Case cases[] = {{"BOOL", 8},    {"U8", 8},      {"I8", 8},          {"F8_E4M3", 8},
                        {"F8_E5M2", 8}, {"F8_E8M0", 8}, {"F8_E4M3FNUZ", 8}, {"F8_E5M2FNUZ", 8},
                        {"F4", 4},      {"F6_E2M3", 6}, {"F6_E3M2", 6},     {"I16", 16},
                        {"U16", 16},    {"F16", 16},    {"BF16", 16},       {"I32", 32},
                        {"U32", 32},    {"F32", 32},    {"I64", 64},        {"U64", 64},
                        {"F64", 64},    {"C64", 64}};
  for (const Case& c : cases) {
    EXPECT_EQ(SafetensorsDTypeBits(c.dtype), c.bits) << c.dtype;
    // Eight elements fill whole bytes for every width.
    const std::string bytes = Builder().Add("t", c.dtype, {2, 4}, Zeros(c.bits)).Build();
    auto f = ParseBytes(bytes);
    PD_ASSERT_OK(f) << c.dtype;
    EXPECT_EQ((*f)->Find("t")->nbytes, c.bits) << c.dtype;
  }
  EXPECT_EQ(SafetensorsDTypeBits("f32"), 0u);
  EXPECT_EQ(SafetensorsDTypeBits(""), 0u);
  EXPECT_EQ(SafetensorsDTypeBits("Q8_0"), 0u);
  EXPECT_EQ(DTypeFromSafetensors("F32"), DType::kF32);
  EXPECT_EQ(DTypeFromSafetensors("F16"), DType::kF16);
  EXPECT_EQ(DTypeFromSafetensors("BF16"), DType::kBF16);
  EXPECT_EQ(DTypeFromSafetensors("F64"), std::nullopt);
  EXPECT_EQ(DTypeFromSafetensors("I8"), std::nullopt);
}

TEST(SafetensorsTest, SubByteDtypesArePacked) {
  const std::string f4 = Builder().Add("t", "F4", {3, 2}, Zeros(3)).Build();
  auto a = ParseBytes(f4);
  PD_ASSERT_OK(a);
  EXPECT_EQ((*a)->Find("t")->nbytes, 3u);
  const std::string f6 = Builder().Add("t", "F6_E3M2", {4}, Zeros(3)).Build();
  PD_EXPECT_OK(ParseBytes(f6));
}

TEST(SafetensorsTest, NullMetadataAndUnknownEntryFieldsAreAccepted) {
  // As in the reference implementation: "__metadata__": null is no metadata, and a tensor entry
  // may carry fields it does not know.
  const std::string bytes =
      Builder()
          .Meta("null")
          .Entry("t", R"({"dtype":"U8","shape":[1],"data_offsets":[0,1],"extra":{"x":[1]}})", "x")
          .Build();
  auto f = ParseBytes(bytes);
  PD_ASSERT_OK(f);
  EXPECT_TRUE((*f)->metadata().empty());
  EXPECT_EQ((*f)->tensors().size(), 1u);
}

TEST(SafetensorsTest, NamesAreUnicodeAndEscapesDecoded) {
  const std::string bytes =
      Builder()
          .Entry(R"(a\"b\u00e9\n)", R"({"dtype":"U8","shape":[1],"data_offsets":[0,1]})", "x")
          .Entry("日本", R"({"dtype":"U8","shape":[1],"data_offsets":[1,2]})", "y")
          .Build();
  auto f = ParseBytes(bytes);
  PD_ASSERT_OK(f);
  EXPECT_NE((*f)->Find("a\"b\xc3\xa9\n"), nullptr);
  EXPECT_NE((*f)->Find("日本"), nullptr);
}

// Written by the Python `safetensors` package (0.8.0, the Rust writer) from numpy arrays:
//   serialize({name: TensorSpec(...)}, metadata={"format": "pt"})
// with ids = int64 [1, -2], empty = float32 zeros (0, 4), model.embed_tokens.weight = float32
// arange(6) as (2, 3), lm_head.weight = bfloat16 [[1, -2], [0.5, 3]], model.norm.weight =
// float16 [1, 2], mask = bool [True, False, True]. Note the header's padding to 8 bytes.
TEST(SafetensorsTest, ReadsAFileWrittenByThePythonLibrary) {
  const std::string header =
      R"({"__metadata__":{"format":"pt"},"ids":{"dtype":"I64","shape":[2],"data_offsets":[0,16]},)"
      R"("empty":{"dtype":"F32","shape":[0,4],"data_offsets":[16,16]},)"
      R"("model.embed_tokens.weight":{"dtype":"F32","shape":[2,3],"data_offsets":[16,40]},)"
      R"("lm_head.weight":{"dtype":"BF16","shape":[2,2],"data_offsets":[40,48]},)"
      R"("model.norm.weight":{"dtype":"F16","shape":[2],"data_offsets":[48,52]},)"
      R"("mask":{"dtype":"BOOL","shape":[3],"data_offsets":[52,55]}} )";
  const std::string data(
      "\x01\x00\x00\x00\x00\x00\x00\x00\xfe\xff\xff\xff\xff\xff\xff\xff\x00\x00\x00\x00\x00\x00"
      "\x80\x3f\x00\x00\x00\x40\x00\x00\x40\x40\x00\x00\x80\x40\x00\x00\xa0\x40\x80\x3f\x00\xc0"
      "\x00\x3f\x40\x40\x00\x3c\x00\x40\x01\x00\x01",
      55);
  ASSERT_EQ(header.size(), 432u);
  const std::string bytes = std::string("\xb0\x01\x00\x00\x00\x00\x00\x00", 8) + header + data;
  ASSERT_EQ(bytes.size(), 495u);

  auto parsed = ParseBytes(bytes);
  PD_ASSERT_OK(parsed);
  const SafetensorsFile& f = **parsed;
  EXPECT_EQ(f.header_size(), 432u);
  EXPECT_THAT(f.metadata(), ElementsAre(std::pair<const std::string, std::string>("format", "pt")));
  std::vector<std::string> names;
  for (const SafetensorsTensor& t : f.tensors()) names.push_back(t.name);
  EXPECT_THAT(names, ElementsAre("ids", "empty", "model.embed_tokens.weight", "lm_head.weight",
                                 "model.norm.weight", "mask"));

  int64_t ids[2];
  std::memcpy(ids, f.Find("ids")->data, sizeof(ids));
  EXPECT_THAT(ids, ElementsAre(1, -2));
  EXPECT_EQ(f.Find("empty")->nbytes, 0u);
  EXPECT_THAT(f.Find("empty")->shape, ElementsAre(0, 4));
  float embd[6];
  std::memcpy(embd, f.Find("model.embed_tokens.weight")->data, sizeof(embd));
  EXPECT_THAT(embd, ElementsAre(0, 1, 2, 3, 4, 5));
  const SafetensorsTensor* head = f.Find("lm_head.weight");
  EXPECT_EQ(head->type, DType::kBF16);
  uint16_t bf[4];
  std::memcpy(bf, head->data, sizeof(bf));
  EXPECT_THAT(bf, ElementsAre(0x3f80, 0xc000, 0x3f00, 0x4040));  // 1, -2, 0.5, 3
  uint16_t h[2];
  std::memcpy(h, f.Find("model.norm.weight")->data, sizeof(h));
  EXPECT_THAT(h, ElementsAre(0x3c00, 0x4000));  // 1, 2
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(f.Find("mask")->data), 3),
            std::string("\x01\x00\x01", 3));
}

// ------------------------------------------------------------------------------------------------
// The header length and the JSON
// ------------------------------------------------------------------------------------------------

TEST(SafetensorsTest, FileShorterThanTheLengthIsDataLoss) {
  for (size_t n = 0; n < 8; ++n) {
    const std::string bytes(n, '\0');
    EXPECT_THAT(ParseBytes(bytes),
                StatusIs(absl::StatusCode::kDataLoss,
                         pd::StrCat("'m.safetensors': the file is ", n, " bytes long, too short")))
        << n;
  }
}

TEST(SafetensorsTest, AbsurdHeaderLengthIsRefused) {
  for (uint64_t n :
       {kSafetensorsMaxHeaderBytes + 1, uint64_t{1} << 40, std::numeric_limits<uint64_t>::max()}) {
    std::string bytes = Le<uint64_t>({n}) + "{}";
    EXPECT_THAT(ParseBytes(bytes),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         pd::StrCat("header length ", n, " exceeds the limit of 100000000 bytes")));
  }
}

TEST(SafetensorsTest, HeaderLengthPastTheEndIsDataLoss) {
  const std::string bytes = Le<uint64_t>({10}) + "{}";
  EXPECT_THAT(ParseBytes(bytes),
              StatusIs(absl::StatusCode::kDataLoss,
                       "header length 10 runs past the end of the file (2 bytes follow"));
}

TEST(SafetensorsTest, HeaderMustBeUtf8) {
  EXPECT_THAT(ParseError("{\"a\xff\":1}"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "the header is not valid UTF-8: byte 11 starts no valid sequence"));
  // An overlong encoding and a lone surrogate are not UTF-8 either.
  EXPECT_THAT(ParseError("{\"\xc0\x80\":1}"),
              StatusIs(absl::StatusCode::kInvalidArgument, "not valid UTF-8"));
  EXPECT_THAT(ParseError("{\"\xed\xa0\x80\":1}"),
              StatusIs(absl::StatusCode::kInvalidArgument, "not valid UTF-8"));
}

TEST(SafetensorsTest, HeaderMustBeJson) {
  for (const char* header : {"", "{", R"({"a":})", "{'a':1}", R"({"a":1,})", "{} x", "{}]",
                             R"({"t":{"dtype":"U8"} /* c */})", "nan"}) {
    EXPECT_THAT(ParseError(header), StatusIs(absl::StatusCode::kInvalidArgument,
                                             "'m.safetensors': the header is not "
                                             "valid JSON (near byte "))
        << header;
  }
}

TEST(SafetensorsTest, NothingMayFollowTheJson) {
  // A NUL after the object (a C writer's terminator) is not JSON whitespace.
  // nlohmann/json alone would stop reading there and accept the header.
  EXPECT_THAT(
      ParseError(std::string("{}\0", 3)),
      StatusIs(absl::StatusCode::kInvalidArgument, "the header is not valid JSON: byte 10 is NUL"));
  EXPECT_THAT(ParseError(std::string("{}\0{\"t\":1}", 10)),
              StatusIs(absl::StatusCode::kInvalidArgument, "is NUL"));
  EXPECT_THAT(ParseSafetensorsIndex(std::string("{\"weight_map\":{\"a\":\"b\"}}\0]", 26)),
              StatusIs(absl::StatusCode::kInvalidArgument, "the index is not valid JSON: byte 24"));
}

TEST(SafetensorsTest, HeaderMustBeAnObject) {
  EXPECT_THAT(ParseError("[]"), StatusIs(absl::StatusCode::kInvalidArgument,
                                         "the header is an array, expected an object"));
  EXPECT_THAT(ParseError("\"x\""), StatusIs(absl::StatusCode::kInvalidArgument,
                                            "the header is a string, expected an object"));
  EXPECT_THAT(ParseError("null"),
              StatusIs(absl::StatusCode::kInvalidArgument, "expected an object"));
  EXPECT_THAT(ParseError("12"), StatusIs(absl::StatusCode::kInvalidArgument, "expected an object"));
}

TEST(SafetensorsTest, DuplicateTensorNameIsRefused) {
  // nlohmann/json would keep the second entry silently; another reader might keep the first.
  const std::string bytes = Builder()
                                .Add("a", "U8", {2}, "xy")
                                .Entry("a", R"({"dtype":"U8","shape":[2],"data_offsets":[0,2]})")
                                .Build();
  EXPECT_THAT(ParseBytes(bytes), StatusIs(absl::StatusCode::kInvalidArgument,
                                          "'m.safetensors': the header: key 'a' appears twice"));
}

TEST(SafetensorsTest, DuplicateKeyInsideAnEntryOrTheMetadataIsRefused) {
  EXPECT_THAT(EntryError(R"({"dtype":"U8","dtype":"I8","shape":[1],"data_offsets":[0,1]})", "x"),
              StatusIs(absl::StatusCode::kInvalidArgument, "key 'dtype' appears twice inside 't'"));
  EXPECT_THAT(
      ParseError(R"({"__metadata__":{"k":"a","k":"b"}})"),
      StatusIs(absl::StatusCode::kInvalidArgument, "key 'k' appears twice inside '__metadata__'"));
  // The same key in two different objects is fine.
  const std::string ok =
      Builder().Meta(R"({"dtype":"x"})").Add("a", "U8", {1}, "x").Add("b", "U8", {1}, "y").Build();
  PD_EXPECT_OK(ParseBytes(ok));
}

TEST(SafetensorsTest, DeeplyNestedJsonFailsCleanly) {
  // Nothing in the parse recurses per level: half a million levels neither overflow the stack
  // nor pass.
  const std::string deep(500000, '[');
  EXPECT_THAT(ParseError(pd::StrCat(R"({"t":)", deep)),
              StatusIs(absl::StatusCode::kInvalidArgument, "not valid JSON"));
  const std::string closed = pd::StrCat(R"({"t":)", deep, std::string(500000, ']'), "}");
  EXPECT_THAT(ParseError(closed), StatusIs(absl::StatusCode::kInvalidArgument,
                                           "tensor 't' is an array, expected an object"));
}

// ------------------------------------------------------------------------------------------------
// Tensor entries
// ------------------------------------------------------------------------------------------------

TEST(SafetensorsTest, EntryMustBeAnObject) {
  for (const char* entry : {"1", "\"F32\"", "[]", "null", "true"}) {
    EXPECT_THAT(EntryError(entry),
                StatusIs(absl::StatusCode::kInvalidArgument, "'m.safetensors': tensor 't' is "))
        << entry;
  }
}

TEST(SafetensorsTest, EntryFieldsMustBePresent) {
  EXPECT_THAT(EntryError(R"({"shape":[1],"data_offsets":[0,1]})", "x"),
              StatusIs(absl::StatusCode::kInvalidArgument, "tensor 't' has no \"dtype\""));
  EXPECT_THAT(EntryError(R"({"dtype":"U8","data_offsets":[0,1]})", "x"),
              StatusIs(absl::StatusCode::kInvalidArgument, "tensor 't' has no \"shape\""));
  EXPECT_THAT(EntryError(R"({"dtype":"U8","shape":[1]})", "x"),
              StatusIs(absl::StatusCode::kInvalidArgument, "tensor 't' has no \"data_offsets\""));
  EXPECT_THAT(EntryError(R"({"Dtype":"U8","shape":[1],"data_offsets":[0,1]})", "x"),
              StatusIs(absl::StatusCode::kInvalidArgument, "tensor 't' has no \"dtype\""));
}

TEST(SafetensorsTest, EntryFieldsMustHaveTheirTypes) {
  EXPECT_THAT(EntryError(R"({"dtype":32,"shape":[1],"data_offsets":[0,1]})", "x"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "tensor 't': \"dtype\" is an integer, expected a string"));
  EXPECT_THAT(EntryError(R"({"dtype":"U8","shape":1,"data_offsets":[0,1]})", "x"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "tensor 't': \"shape\" is an integer, expected an array"));
  EXPECT_THAT(EntryError(R"({"dtype":"U8","shape":{"0":1},"data_offsets":[0,1]})", "x"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "tensor 't': \"shape\" is an object, expected an array"));
  EXPECT_THAT(EntryError(R"({"dtype":"U8","shape":[1],"data_offsets":"0,1"})", "x"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "tensor 't': \"data_offsets\" is a string, expected [begin, end]"));
  EXPECT_THAT(EntryError(R"({"dtype":"U8","shape":[1],"data_offsets":[0,1,1]})", "x"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "\"data_offsets\" is an array of 3 elements, expected [begin, end]"));
  EXPECT_THAT(EntryError(R"({"dtype":"U8","shape":[1],"data_offsets":[1]})", "x"),
              StatusIs(absl::StatusCode::kInvalidArgument, "an array of 1 elements"));
}

TEST(SafetensorsTest, UnknownDtypeIsRefused) {
  for (const char* dtype : {"Q4_0", "f32", "float32", "", "F32 ", "F8"}) {
    EXPECT_THAT(
        EntryError(pd::StrCat(R"({"dtype":")", dtype, R"(","shape":[1],"data_offsets":[0,4]})"),
                   Zeros(4)),
        StatusIs(absl::StatusCode::kInvalidArgument,
                 pd::StrCat("tensor 't' has unknown dtype '", dtype, "'")))
        << dtype;
  }
}

TEST(SafetensorsTest, LongNamesAreShortenedInMessages) {
  // A hostile name must not turn into a status as long as the header.
  const std::string name = "\xc3\xa9" + std::string(100000, 'n');  // "é" then n's
  const absl::Status s = ParseError(
      pd::StrCat(R"({")", name, R"(":{"dtype":"Q","shape":[],"data_offsets":[0,1]}})"), "x");
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument, "has unknown dtype 'Q'"));
  EXPECT_THAT(std::string(s.message()), HasSubstr(pd::StrCat("tensor '\xc3\xa9nnn")));
  EXPECT_THAT(std::string(s.message()), HasSubstr("nnn...'"));
  EXPECT_LT(s.message().size(), 300u);
  // Cut at a character boundary: "é" (2 bytes) straddles byte 200 here.
  const std::string odd = std::string(199, 'a') + "\xc3\xa9" + std::string(1000, 'b');
  const absl::Status t = ParseError(pd::StrCat(R"({")", odd, R"(":1})"));
  EXPECT_THAT(std::string(t.message()), HasSubstr(pd::StrCat(std::string(199, 'a'), "...'")));
}

TEST(SafetensorsTest, ShapeEntriesMustBeNonNegativeIntegers) {
  EXPECT_THAT(
      EntryError(R"({"dtype":"U8","shape":[2,-1],"data_offsets":[0,0]})"),
      StatusIs(absl::StatusCode::kInvalidArgument,
               "tensor 't': shape[1] is a negative integer, expected a non-negative integer"));
  EXPECT_THAT(EntryError(R"({"dtype":"U8","shape":[2.0],"data_offsets":[0,2]})", "xy"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "shape[0] is a floating-point number, expected a non-negative integer"));
  EXPECT_THAT(EntryError(R"({"dtype":"U8","shape":[1e1],"data_offsets":[0,10]})", Zeros(10)),
              StatusIs(absl::StatusCode::kInvalidArgument, "shape[0] is a floating-point number"));
  EXPECT_THAT(EntryError(R"({"dtype":"U8","shape":["2"],"data_offsets":[0,2]})", "xy"),
              StatusIs(absl::StatusCode::kInvalidArgument, "shape[0] is a string"));
  EXPECT_THAT(EntryError(R"({"dtype":"U8","shape":[null],"data_offsets":[0,2]})", "xy"),
              StatusIs(absl::StatusCode::kInvalidArgument, "shape[0] is null"));
  // Beyond u64: nlohmann reads it as a float.
  EXPECT_THAT(EntryError(R"({"dtype":"U8","shape":[18446744073709551616],"data_offsets":[0,0]})"),
              StatusIs(absl::StatusCode::kInvalidArgument, "shape[0] is a floating-point number"));
  EXPECT_THAT(EntryError(R"({"dtype":"U8","shape":[9223372036854775808],"data_offsets":[0,0]})"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "shape[0] = 9223372036854775808 is out of range"));
}

TEST(SafetensorsTest, MinusZeroIsRefused) {
  // As in the reference implementation, which reads JSON's -0 as a float.
  EXPECT_THAT(EntryError(R"({"dtype":"U8","shape":[-0],"data_offsets":[0,0]})"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "shape[0] is a negative integer, expected a non-negative integer"));
  EXPECT_THAT(
      EntryError(R"({"dtype":"U8","shape":[0],"data_offsets":[-0,0]})"),
      StatusIs(absl::StatusCode::kInvalidArgument, "data_offsets[0] is a negative integer"));
}

TEST(SafetensorsTest, ElementCountOverflowIsRefused) {
  EXPECT_THAT(
      EntryError(R"({"dtype":"U8","shape":[4294967296,4294967296],"data_offsets":[0,0]})"),
      StatusIs(absl::StatusCode::kInvalidArgument,
               "tensor 't': the element count of shape [4294967296, 4294967296] overflows"));
  // The count fits in int64 but its bits do not fit in u64.
  EXPECT_THAT(EntryError(R"({"dtype":"F64","shape":[4611686018427387904],"data_offsets":[0,0]})"),
              StatusIs(absl::StatusCode::kInvalidArgument, "overflows"));
  // Overflow before a zero dimension is still overflow, as in the reference implementation.
  EXPECT_THAT(
      EntryError(R"({"dtype":"U8","shape":[4294967296,4294967296,0],"data_offsets":[0,0]})"),
      StatusIs(absl::StatusCode::kInvalidArgument, "overflows"));
}

TEST(SafetensorsTest, DataOffsetsMustBeOrderedNonNegativeIntegers) {
  EXPECT_THAT(EntryError(R"({"dtype":"U8","shape":[1],"data_offsets":[-1,0]})", "x"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "tensor 't': data_offsets[0] is a negative integer"));
  EXPECT_THAT(EntryError(R"({"dtype":"U8","shape":[1],"data_offsets":[0,1.5]})", "x"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "tensor 't': data_offsets[1] is a floating-point number"));
  EXPECT_THAT(EntryError(R"({"dtype":"U8","shape":[1],"data_offsets":[0,"1"]})", "x"),
              StatusIs(absl::StatusCode::kInvalidArgument, "data_offsets[1] is a string"));
  EXPECT_THAT(EntryError(R"({"dtype":"U8","shape":[0],"data_offsets":[1,0]})", "x"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "tensor 't': data_offsets [1, 0] end before they begin"));
}

TEST(SafetensorsTest, ByteSizeMustMatchShapeAndDtype) {
  EXPECT_THAT(EntryError(R"({"dtype":"F32","shape":[2,3],"data_offsets":[0,20]})", Zeros(20)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "tensor 't': data_offsets [0, 20] span 20 bytes, but F32 [2, 3] takes 24"));
  EXPECT_THAT(EntryError(R"({"dtype":"BF16","shape":[3],"data_offsets":[0,8]})", Zeros(8)),
              StatusIs(absl::StatusCode::kInvalidArgument, "span 8 bytes, but BF16 [3] takes 6"));
  EXPECT_THAT(EntryError(R"({"dtype":"F64","shape":[],"data_offsets":[0,4]})", Zeros(4)),
              StatusIs(absl::StatusCode::kInvalidArgument, "span 4 bytes, but F64 [] takes 8"));
  EXPECT_THAT(EntryError(R"({"dtype":"F4","shape":[3],"data_offsets":[0,2]})", Zeros(2)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "tensor 't': 3 elements of F4 (4 bits each) do not fill whole bytes"));
  EXPECT_THAT(EntryError(R"({"dtype":"F6_E2M3","shape":[2],"data_offsets":[0,2]})", Zeros(2)),
              StatusIs(absl::StatusCode::kInvalidArgument, "do not fill whole bytes"));
}

TEST(SafetensorsTest, TensorPastTheEndOfTheDataIsDataLoss) {
  EXPECT_THAT(EntryError(R"({"dtype":"F32","shape":[4],"data_offsets":[0,16]})", Zeros(12)),
              StatusIs(absl::StatusCode::kDataLoss,
                       "'m.safetensors': tensor 't': data_offsets [0, 16] run past the end of the "
                       "12-byte data buffer (file truncated?)"));
  const std::string max = "18446744073709551615";
  EXPECT_THAT(
      EntryError(pd::StrCat(R"({"dtype":"U8","shape":[1],"data_offsets":[)", max, ",", max, "]}")),
      StatusIs(absl::StatusCode::kInvalidArgument, "span 0 bytes, but U8 [1] takes 1"));
  EXPECT_THAT(
      EntryError(pd::StrCat(R"({"dtype":"U8","shape":[0],"data_offsets":[)", max, ",", max, "]}")),
      StatusIs(absl::StatusCode::kDataLoss, "run past the end"));
}

// ------------------------------------------------------------------------------------------------
// The layout of the data buffer
// ------------------------------------------------------------------------------------------------

TEST(SafetensorsTest, OverlappingTensorsAreRefused) {
  const std::string bytes = Builder()
                                .Entry("a", R"({"dtype":"U8","shape":[8],"data_offsets":[0,8]})")
                                .Entry("b", R"({"dtype":"U8","shape":[8],"data_offsets":[4,12]})")
                                .Data(Zeros(12))
                                .Build();
  EXPECT_THAT(ParseBytes(bytes), StatusIs(absl::StatusCode::kInvalidArgument,
                                          "'m.safetensors': tensors 'a' [0, 8) and 'b' [4, 12) "
                                          "overlap"));
  // Two names for the same bytes overlap too.
  const std::string alias = Builder()
                                .Entry("a", R"({"dtype":"U8","shape":[4],"data_offsets":[0,4]})")
                                .Entry("b", R"({"dtype":"I8","shape":[4],"data_offsets":[0,4]})")
                                .Data(Zeros(4))
                                .Build();
  EXPECT_THAT(ParseBytes(alias), StatusIs(absl::StatusCode::kInvalidArgument, "overlap"));
  // So does an empty tensor inside another one.
  const std::string inside = Builder()
                                 .Entry("a", R"({"dtype":"U8","shape":[4],"data_offsets":[0,4]})")
                                 .Entry("e", R"({"dtype":"U8","shape":[0],"data_offsets":[2,2]})")
                                 .Data(Zeros(4))
                                 .Build();
  EXPECT_THAT(ParseBytes(inside),
              StatusIs(absl::StatusCode::kInvalidArgument, "tensors 'a' [0, 4) and 'e' [2, 2)"));
}

TEST(SafetensorsTest, GapsInTheDataBufferAreRefused) {
  // As in the reference implementation (MetadataIncompleteBuffer): every byte belongs to a tensor.
  const std::string hole = Builder()
                               .Entry("a", R"({"dtype":"U8","shape":[4],"data_offsets":[0,4]})")
                               .Entry("b", R"({"dtype":"U8","shape":[4],"data_offsets":[8,12]})")
                               .Data(Zeros(12))
                               .Build();
  EXPECT_THAT(ParseBytes(hole),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "bytes [4, 8) of the data buffer, before tensor 'b', belong to no tensor"));
  const std::string leading = Builder()
                                  .Entry("a", R"({"dtype":"U8","shape":[4],"data_offsets":[2,6]})")
                                  .Data(Zeros(6))
                                  .Build();
  EXPECT_THAT(ParseBytes(leading),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "bytes [0, 2) of the data buffer, before tensor 'a', belong to no tensor"));
}

TEST(SafetensorsTest, TrailingBytesAreRefused) {
  const std::string bytes = Builder().Add("a", "U8", {4}, "abcd").Data("ef").Build();
  EXPECT_THAT(ParseBytes(bytes),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "bytes [4, 6) at the end of the 6-byte data buffer belong to no tensor"));
  // Data without any tensor.
  EXPECT_THAT(ParseError("{}", "x"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "bytes [0, 1) at the end of the 1-byte data buffer belong to no tensor"));
}

TEST(SafetensorsTest, EveryTruncationFailsCleanly) {
  const std::string bytes = Builder()
                                .Meta(R"({"format":"pt"})")
                                .Add("a", "F32", {2, 2}, Zeros(16))
                                .Add("b", "BF16", {3}, Zeros(6))
                                .Build();
  PD_ASSERT_OK(ParseBytes(bytes));
  for (size_t n = 0; n < bytes.size(); ++n) {
    // An exact-size copy, so that a read past the end would be a heap overflow for ASan.
    std::unique_ptr<char[]> copy(new char[n == 0 ? 1 : n]);
    std::memcpy(copy.get(), bytes.data(), n);
    auto f = SafetensorsFile::Parse(MappedFile::Borrow(copy.get(), n), kName);
    ASSERT_FALSE(f.ok()) << n;
    EXPECT_TRUE(f.status().code() == absl::StatusCode::kDataLoss ||
                f.status().code() == absl::StatusCode::kInvalidArgument)
        << n << ": " << f.status();
  }
}

// ------------------------------------------------------------------------------------------------
// __metadata__
// ------------------------------------------------------------------------------------------------

TEST(SafetensorsTest, MetadataMustBeAnObjectOfStrings) {
  EXPECT_THAT(ParseError(R"({"__metadata__":"pt"})"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "'m.safetensors': \"__metadata__\" is a string, expected an object of "
                       "strings"));
  EXPECT_THAT(ParseError(R"({"__metadata__":["a"]})"),
              StatusIs(absl::StatusCode::kInvalidArgument, "\"__metadata__\" is an array"));
  EXPECT_THAT(ParseError(R"({"__metadata__":{"format":"pt","layers":32}})"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "\"__metadata__\" key 'layers' is an integer, expected a string"));
  EXPECT_THAT(ParseError(R"({"__metadata__":{"a":{"b":"c"}}})"),
              StatusIs(absl::StatusCode::kInvalidArgument, "key 'a' is an object"));
  EXPECT_THAT(ParseError(R"({"__metadata__":{"a":null}})"),
              StatusIs(absl::StatusCode::kInvalidArgument, "key 'a' is null"));
}

// ------------------------------------------------------------------------------------------------
// The index
// ------------------------------------------------------------------------------------------------

TEST(SafetensorsIndexTest, ParsesTheWeightMap) {
  auto index = ParseSafetensorsIndex(R"({
    "metadata": {"total_size": 1234},
    "weight_map": {
      "b": "model-00002-of-00002.safetensors",
      "a": "model-00001-of-00002.safetensors",
      "c": "model-00001-of-00002.safetensors"
    }
  })");
  PD_ASSERT_OK(index);
  EXPECT_EQ(index->weight_map.size(), 3u);
  EXPECT_EQ(index->weight_map.at("b"), "model-00002-of-00002.safetensors");
  EXPECT_THAT(index->shards,
              ElementsAre("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"));
}

TEST(SafetensorsIndexTest, RefusesMalformedIndexes) {
  using absl::StatusCode;
  struct Case {
    std::string json;
    std::string error;
  };
  const Case cases[] = {
      {"", "the index is not valid JSON"},
      {R"({"weight_map":{"a":"x"})", "the index is not valid JSON"},
      {"{\"weight_map\":{\"a\":\"\xff\"}}", "the index is not valid UTF-8"},
      {R"(["weight_map"])", "the index is an array, expected an object"},
      {R"({"metadata":{}})", "the index has no \"weight_map\""},
      {R"({"weight_map":["a","x"]})", "\"weight_map\" is an array, expected an object"},
      {R"({"weight_map":{}})", "\"weight_map\" lists no tensor"},
      {R"({"weight_map":{"a":1}})", "maps tensor 'a' to an integer, expected a shard's file name"},
      {R"({"weight_map":{"a":null}})", "maps tensor 'a' to null"},
      {R"({"weight_map":{"a":"x","a":"y"}})", "key 'a' appears twice inside 'weight_map'"},
      {R"({"weight_map":{"a":"x"},"weight_map":{"a":"y"}})", "key 'weight_map' appears twice"},
  };
  for (const Case& c : cases) {
    EXPECT_THAT(ParseSafetensorsIndex(c.json), StatusIs(StatusCode::kInvalidArgument, c.error))
        << c.json;
  }
}

TEST(SafetensorsIndexTest, ShardsMustBePlainFileNames) {
  for (const char* shard : {"", ".", "..", "../model.safetensors", "/etc/passwd",
                            "sub/model.safetensors", "..\\\\model.safetensors", "a\\u0000b"}) {
    EXPECT_THAT(ParseSafetensorsIndex(pd::StrCat(R"({"weight_map":{"t":")", shard, R"("}})")),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         "which is not a plain file name in the checkpoint's folder"))
        << shard;
  }
  EXPECT_THAT(
      ParseSafetensorsIndex(pd::StrCat(R"({"weight_map":{"t":")", std::string(256, 'a'), R"("}})")),
      StatusIs(absl::StatusCode::kInvalidArgument, "not a plain file name"));
  // Dots inside a name are fine.
  PD_EXPECT_OK(ParseSafetensorsIndex(R"({"weight_map":{"t":"a..b.safetensors"}})"));
}

// ------------------------------------------------------------------------------------------------
// Files on disk and checkpoint folders
// ------------------------------------------------------------------------------------------------

class SafetensorsCheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = pd::StrCat(::testing::TempDir(), "safetensors_test_", getpid(), "_",
                      ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
    ASSERT_TRUE(std::filesystem::create_directories(dir_, ec)) << dir_ << ": " << ec.message();
  }
  void TearDown() override {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  std::string Write(const std::string& name, const std::string& bytes) {
    const std::string path = dir_ + "/" + name;
    std::ofstream(path, std::ios::binary) << bytes;
    return path;
  }
  // An index whose weight_map is `pairs` (tensor, shard).
  std::string WriteIndex(const std::vector<std::pair<std::string, std::string>>& pairs,
                         const std::string& name = "model.safetensors.index.json") {
    std::string map;
    for (const auto& [t, s] : pairs) {
      absl::StrAppend(&map, map.empty() ? "" : ",", "\"", t, "\":\"", s, "\"");
    }
    return Write(name, pd::StrCat(R"({"metadata":{"total_size":0},"weight_map":{)", map, "}}"));
  }
  std::string dir_;
};

// Two shards of a small model, and its index.
constexpr char kShard1[] = "model-00001-of-00002.safetensors";
constexpr char kShard2[] = "model-00002-of-00002.safetensors";

std::string Shard1() {
  return Builder()
      .Meta(R"({"format":"pt"})")
      .Add("model.layers.0.self_attn.q_proj.weight", "BF16", {4, 2}, Zeros(16))
      .Add("model.embed_tokens.weight", "F32", {3, 2}, Le<float>({1, 2, 3, 4, 5, 6}))
      .Build();
}
std::string Shard2() {
  return Builder()
      .Add("model.norm.weight", "F16", {2}, Le<uint16_t>({0x3c00, 0x4000}))
      .Add("lm_head.weight", "BF16", {3, 2}, Zeros(12))
      .Build();
}

TEST_F(SafetensorsCheckpointTest, OpensOneFileFromDisk) {
  const std::string path = Write("weights.safetensors", Shard1());
  auto f = SafetensorsFile::Open(path);
  PD_ASSERT_OK(f);
  EXPECT_EQ((*f)->name(), "weights.safetensors");
  ASSERT_NE((*f)->Find("model.embed_tokens.weight"), nullptr);
  EXPECT_EQ((*f)->Find("model.embed_tokens.weight")->file, "weights.safetensors");
  float x[6];
  std::memcpy(x, (*f)->Find("model.embed_tokens.weight")->data, sizeof(x));
  EXPECT_THAT(x, ElementsAre(1, 2, 3, 4, 5, 6));

  EXPECT_THAT(SafetensorsFile::Open(dir_ + "/nope.safetensors"),
              StatusIs(absl::StatusCode::kNotFound, "nope.safetensors"));
  // Errors start with the path.
  const std::string bad = Write("bad.safetensors", FileBytes("[]"));
  EXPECT_THAT(SafetensorsFile::Open(bad),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       pd::StrCat("'", bad, "': the header is an array")));
}

TEST_F(SafetensorsCheckpointTest, SingleFileFolder) {
  Write("model.safetensors", Shard1());
  auto c = SafetensorsCheckpoint::Open(dir_);
  PD_ASSERT_OK(c);
  EXPECT_EQ((*c)->dir(), dir_);
  ASSERT_EQ((*c)->files().size(), 1u);
  EXPECT_EQ((*c)->files()[0]->name(), "model.safetensors");
  ASSERT_EQ((*c)->tensors().size(), 2u);
  EXPECT_EQ((*c)->tensors()[0]->name, "model.embed_tokens.weight");
  EXPECT_EQ((*c)->tensors()[1]->name, "model.layers.0.self_attn.q_proj.weight");
  EXPECT_EQ((*c)->Find("model.embed_tokens.weight")->file, "model.safetensors");
  EXPECT_EQ((*c)->total_nbytes(), 40u);
  EXPECT_EQ((*c)->Find("lm_head.weight"), nullptr);
}

TEST_F(SafetensorsCheckpointTest, ShardedFolderWithIndex) {
  Write(kShard1, Shard1());
  Write(kShard2, Shard2());
  WriteIndex({{"model.embed_tokens.weight", kShard1},
              {"model.layers.0.self_attn.q_proj.weight", kShard1},
              {"model.norm.weight", kShard2},
              {"lm_head.weight", kShard2}});
  // A consolidated copy beside the shards (as Mistral ships) is not read.
  Write("consolidated.safetensors", Shard1());
  auto c = SafetensorsCheckpoint::Open(dir_);
  PD_ASSERT_OK(c);
  ASSERT_EQ((*c)->files().size(), 2u);
  EXPECT_EQ((*c)->files()[0]->name(), kShard1);
  EXPECT_EQ((*c)->files()[1]->name(), kShard2);
  std::vector<std::string> names;
  for (const SafetensorsTensor* t : (*c)->tensors()) names.push_back(t->name);
  EXPECT_THAT(names, ElementsAre("lm_head.weight", "model.embed_tokens.weight",
                                 "model.layers.0.self_attn.q_proj.weight", "model.norm.weight"));
  const SafetensorsTensor* norm = (*c)->Find("model.norm.weight");
  ASSERT_NE(norm, nullptr);
  EXPECT_EQ(norm->file, kShard2);
  EXPECT_EQ(norm->type, DType::kF16);
  uint16_t h[2];
  std::memcpy(h, norm->data, sizeof(h));
  EXPECT_THAT(h, ElementsAre(0x3c00, 0x4000));
  EXPECT_EQ((*c)->Find("model.embed_tokens.weight")->file, kShard1);
  EXPECT_EQ((*c)->total_nbytes(), 16u + 24u + 4u + 12u);
  EXPECT_EQ((*c)->files()[0]->metadata().at("format"), "pt");

  // The index can also be named directly, and so can one shard.
  auto by_index = SafetensorsCheckpoint::Open(dir_ + "/model.safetensors.index.json");
  PD_ASSERT_OK(by_index);
  EXPECT_EQ((*by_index)->tensors().size(), 4u);
  EXPECT_EQ((*by_index)->dir(), dir_);
  auto by_file = SafetensorsCheckpoint::Open(dir_ + "/" + kShard2);
  PD_ASSERT_OK(by_file);
  EXPECT_EQ((*by_file)->tensors().size(), 2u);
}

TEST_F(SafetensorsCheckpointTest, ModelSafetensorsWinsOverAnIndex) {
  // transformers looks for model.safetensors first; so do we.
  Write("model.safetensors", Shard2());
  WriteIndex({{"x", "missing.safetensors"}});
  auto c = SafetensorsCheckpoint::Open(dir_);
  PD_ASSERT_OK(c);
  EXPECT_EQ((*c)->tensors().size(), 2u);
  EXPECT_NE((*c)->Find("lm_head.weight"), nullptr);
}

TEST_F(SafetensorsCheckpointTest, FolderWithoutIndexReadsEverySafetensorsFile) {
  Write("b.safetensors", Shard2());
  Write("a.safetensors", Shard1());
  Write("notes.txt", "not a tensor file");
  std::filesystem::create_directory(dir_ + "/sub.safetensors");  // a folder, not a file
  auto c = SafetensorsCheckpoint::Open(dir_);
  PD_ASSERT_OK(c);
  ASSERT_EQ((*c)->files().size(), 2u);
  EXPECT_EQ((*c)->files()[0]->name(), "a.safetensors");
  EXPECT_EQ((*c)->tensors().size(), 4u);
  EXPECT_EQ((*c)->Find("lm_head.weight")->file, "b.safetensors");
}

TEST_F(SafetensorsCheckpointTest, SameTensorInTwoFilesWithoutIndexIsRefused) {
  Write("a.safetensors", Shard1());
  Write("b.safetensors", Shard1());
  EXPECT_THAT(SafetensorsCheckpoint::Open(dir_),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "tensor 'model.embed_tokens.weight' is in both 'a.safetensors' and "
                       "'b.safetensors'"));
}

TEST_F(SafetensorsCheckpointTest, MissingOrEmptyFolderIsNotFound) {
  EXPECT_THAT(SafetensorsCheckpoint::Open(dir_),
              StatusIs(absl::StatusCode::kNotFound, "has no model.safetensors"));
  EXPECT_THAT(SafetensorsCheckpoint::Open(dir_ + "/nope"),
              StatusIs(absl::StatusCode::kNotFound, "does not exist"));
}

TEST_F(SafetensorsCheckpointTest, IndexNamingAMissingShardIsNotFound) {
  Write(kShard1, Shard1());
  WriteIndex({{"model.embed_tokens.weight", kShard1},
              {"model.layers.0.self_attn.q_proj.weight", kShard1},
              {"model.norm.weight", kShard2}});
  EXPECT_THAT(SafetensorsCheckpoint::Open(dir_), StatusIs(absl::StatusCode::kNotFound, kShard2));
}

TEST_F(SafetensorsCheckpointTest, MalformedShardIsNamed) {
  Write(kShard1, Shard1());
  std::string broken = Shard2();
  broken.pop_back();
  Write(kShard2, broken);
  WriteIndex({{"model.embed_tokens.weight", kShard1},
              {"model.layers.0.self_attn.q_proj.weight", kShard1},
              {"model.norm.weight", kShard2},
              {"lm_head.weight", kShard2}});
  EXPECT_THAT(SafetensorsCheckpoint::Open(dir_),
              StatusIs(absl::StatusCode::kDataLoss,
                       pd::StrCat(kShard2, "': tensor 'lm_head.weight': data_offsets")));
}

TEST_F(SafetensorsCheckpointTest, IndexedTensorMissingFromItsShardIsRefused) {
  Write(kShard1, Shard1());
  Write(kShard2, Shard2());
  WriteIndex({{"model.embed_tokens.weight", kShard1},
              {"model.layers.0.self_attn.q_proj.weight", kShard1},
              {"model.norm.weight", kShard2},
              {"lm_head.weight", kShard1}});  // it is in shard 2
  EXPECT_THAT(SafetensorsCheckpoint::Open(dir_),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       pd::StrCat("the index puts tensor 'lm_head.weight' in '", kShard1,
                                  "', which has no such tensor")));
}

TEST_F(SafetensorsCheckpointTest, ShardTensorMissingFromTheIndexIsRefused) {
  Write(kShard1, Shard1());
  Write(kShard2, Shard2());
  WriteIndex({{"model.embed_tokens.weight", kShard1},
              {"model.layers.0.self_attn.q_proj.weight", kShard1},
              {"model.norm.weight", kShard2}});
  EXPECT_THAT(SafetensorsCheckpoint::Open(dir_),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       pd::StrCat("tensor 'lm_head.weight' of shard '", kShard2,
                                  "' is not in the index's weight_map")));
}

TEST_F(SafetensorsCheckpointTest, TensorInTwoShardsIsRefused) {
  Write(kShard1, Shard1());
  // Shard 2 carries a second copy of the embedding.
  Write(kShard2, Builder()
                     .Add("model.norm.weight", "F16", {2}, Zeros(4))
                     .Add("model.embed_tokens.weight", "F32", {3, 2}, Zeros(24))
                     .Build());
  WriteIndex({{"model.embed_tokens.weight", kShard1},
              {"model.layers.0.self_attn.q_proj.weight", kShard1},
              {"model.norm.weight", kShard2}});
  EXPECT_THAT(SafetensorsCheckpoint::Open(dir_),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       pd::StrCat("tensor 'model.embed_tokens.weight' is in shard '", kShard2,
                                  "' as well as in '", kShard1, "', where the index puts it")));
}

TEST_F(SafetensorsCheckpointTest, IndexCannotReachOutsideTheFolder) {
  const std::string sub = dir_ + "/sub";
  std::filesystem::create_directory(sub);
  Write("outside.safetensors", Shard1());
  const std::string index =
      pd::StrCat(R"({"weight_map":{"model.embed_tokens.weight":"../outside.safetensors"}})");
  std::ofstream(sub + "/model.safetensors.index.json") << index;
  EXPECT_THAT(SafetensorsCheckpoint::Open(sub),
              StatusIs(absl::StatusCode::kInvalidArgument, "not a plain file name"));
}

TEST_F(SafetensorsCheckpointTest, MalformedIndexNamesTheIndex) {
  const std::string path = Write("model.safetensors.index.json", R"({"weight_map":[]})");
  EXPECT_THAT(SafetensorsCheckpoint::Open(dir_),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       pd::StrCat("'", path, "': the index's \"weight_map\" is an array")));
}

}  // namespace
}  // namespace pd::engine
