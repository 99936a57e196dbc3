// Unigram tokenizer (tokenizer.ggml.model = t5) on small vocabularies built in memory: the Viterbi
// choice, unknown runs, the whitespace flags, the precompiled charsmap, byte fallback, the t5
// defaults, and the errors for malformed charsmaps. Ids against Hugging Face and llama.cpp are
// checked by tests/python/test_unigram_tokenizer.py.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "common/status_matchers.h"
#include "engine/model/gguf.h"
#include "engine/tokenizer/tokenizer.h"
#include "tests/testing/gguf_builder.h"

namespace pd::engine {
namespace {

using ::pd::testing::StatusIs;
using ::testing::ElementsAre;
using testing::GgufBuilder;

constexpr char kSp[] = "\xE2\x96\x81";  // U+2581

absl::StatusOr<std::unique_ptr<Tokenizer>> Build(const GgufBuilder& b) {
  static auto* keep = new std::vector<std::string>();  // GgufFile borrows the bytes
  keep->push_back(b.Build());
  PD_ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> gguf, testing::ParseBytes(keep->back()));
  return Tokenizer::FromGguf(*gguf);
}

// 0 <pad>, 1 </s>, 2 <unk>, 3 ▁ (-2), 4 a (-3), 5 b (-3), 6 ▁ab (-4), 7 ab (-5), 8 c (-6),
// 9 ▁a (-3.5), 10 <u> (user-defined); with `bytes`, the 256 byte tokens from 11.
GgufBuilder UgmVocab(bool bytes = false) {
  std::vector<std::string> tokens = {"<pad>",
                                     "</s>",
                                     "<unk>",
                                     kSp,
                                     "a",
                                     "b",
                                     std::string(kSp) + "ab",
                                     "ab",
                                     "c",
                                     std::string(kSp) + "a",
                                     "<u>"};
  std::vector<float> scores = {0, 0, 0, -2, -3, -3, -4, -5, -6, -3.5f, 0};
  std::vector<int32_t> types = {3, 3, 2, 1, 1, 1, 1, 1, 1, 1, 4};
  for (int i = 0; bytes && i < 256; ++i) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", i);
    tokens.push_back(name);
    scores.push_back(0);
    types.push_back(6);
  }
  GgufBuilder b;
  b.Str("tokenizer.ggml.model", "t5").StrArray("tokenizer.ggml.tokens", tokens);
  b.Array<float>("tokenizer.ggml.scores", GgufValueType::kFloat32, scores);
  b.Array<int32_t>("tokenizer.ggml.token_type", GgufValueType::kInt32, types);
  return b;
}

// A charsmap of one key, TAB -> " ", in `units` units (768 is well formed: whole blocks).
std::string TabCharsmap(size_t units = 768, uint32_t value = 0,
                        std::string strings = std::string(" \0", 2)) {
  std::vector<uint32_t> u(units, 0);
  u[0] = 256u << 10;                                                    // root: children at 256
  if (265 < units) u[256 ^ 9] = ((265u ^ 512u) << 10) | (1u << 8) | 9;  // TAB, value below 512
  if (512 < units) u[512] = 0x80000000u | value;  // the value: a string offset
  std::string blob;
  auto put = [&](uint32_t x) {
    for (int i = 0; i < 4; ++i) blob.push_back(static_cast<char>(x >> (8 * i)));
  };
  put(static_cast<uint32_t>(units * 4));
  for (uint32_t x : u) put(x);
  return blob + strings;
}

GgufBuilder& Charsmap(GgufBuilder& b, const std::string& blob) {
  return b.Array<uint8_t>("tokenizer.ggml.precompiled_charsmap", GgufValueType::kUint8,
                          std::vector<uint8_t>(blob.begin(), blob.end()));
}

TEST(UgmTest, ViterbiPicksTheMostProbableSegmentation) {
  GgufBuilder b = UgmVocab();
  b.Bool("tokenizer.ggml.add_space_prefix", true);
  absl::StatusOr<std::unique_ptr<Tokenizer>> tok = Build(b);
  PD_ASSERT_OK(tok);
  const Tokenizer& t = **tok;
  EXPECT_EQ(t.model(), TokenizerModel::kUgm);
  // "▁ab": ▁ab (-4) beats ▁a b (-6.5), ▁ ab (-7) and ▁ a b (-8).
  EXPECT_THAT(t.Encode("ab", false, false), ElementsAre(6));
  EXPECT_THAT(t.Encode("ab c", false, false), ElementsAre(6, 3, 8));
  // Unknown characters become one <unk> per run.
  EXPECT_THAT(t.Encode("xy", false, false), ElementsAre(3, 2));
  EXPECT_THAT(t.Encode("axyb", false, false), ElementsAre(9, 2, 5));
  // An invalid byte is normalized to U+FFFD, unknown here.
  EXPECT_THAT(t.Encode("\xFF", false, false), ElementsAre(3, 2));
  // User-defined tokens are matched whole; each run of text gets its own space prefix.
  EXPECT_THAT(t.Encode("a<u>b", false, false), ElementsAre(9, 10, 3, 5));
  // t5 defaults: EOS is added, no BOS; pad 0, unk 2.
  EXPECT_THAT(t.Encode("ab", true, false), ElementsAre(6, 1));
  EXPECT_EQ(t.bos(), kNoToken);
  EXPECT_EQ(t.eos(), 1);
  EXPECT_EQ(t.unk(), 2);
  EXPECT_EQ(t.pad(), 0);
  EXPECT_TRUE(t.IsEog(1));
  // Decoding drops the first space, as llama.cpp does when the prefix is added.
  EXPECT_EQ(t.Decode({6, 3, 8}), "ab c");
  EXPECT_EQ(t.Decode({6, 3, 8, 1}), "ab c");
}

TEST(UgmTest, WhitespaceFlags) {
  {
    // No add_space_prefix key: llama.cpp's t5 default is no prefix.
    absl::StatusOr<std::unique_ptr<Tokenizer>> tok = Build(UgmVocab());
    PD_ASSERT_OK(tok);
    EXPECT_THAT((*tok)->Encode("a", false, false), ElementsAre(4));
    EXPECT_THAT((*tok)->Encode(" a", false, false), ElementsAre(9));
    EXPECT_THAT((*tok)->Encode("a  b", false, false), ElementsAre(4, 3, 3, 5));
  }
  {
    // remove_extra_whitespaces: leading and trailing spaces go, runs become one U+2581, and every
    // word gets one (even without add_space_prefix, as in llama.cpp).
    GgufBuilder b = UgmVocab();
    b.Bool("tokenizer.ggml.remove_extra_whitespaces", true);
    absl::StatusOr<std::unique_ptr<Tokenizer>> tok = Build(b);
    PD_ASSERT_OK(tok);
    EXPECT_THAT((*tok)->Encode("  a   b  ", false, false), ElementsAre(9, 3, 5));
    EXPECT_THAT((*tok)->Encode("   ", false, false), ElementsAre());
  }
}

TEST(UgmTest, PrecompiledCharsmapNormalizes) {
  GgufBuilder b = UgmVocab();
  b.Bool("tokenizer.ggml.add_space_prefix", true);
  Charsmap(b, TabCharsmap());
  absl::StatusOr<std::unique_ptr<Tokenizer>> tok = Build(b);
  PD_ASSERT_OK(tok);
  EXPECT_THAT((*tok)->Encode("a\tb", false, false), ElementsAre(9, 3, 5));
  EXPECT_THAT((*tok)->Encode("a b", false, false), ElementsAre(9, 3, 5));
}

TEST(UgmTest, ByteFallbackSpellsUnknownText) {
  GgufBuilder b = UgmVocab(/*bytes=*/true);
  b.Bool("tokenizer.ggml.add_space_prefix", true);
  absl::StatusOr<std::unique_ptr<Tokenizer>> tok = Build(b);
  PD_ASSERT_OK(tok);
  const int32_t x = 11 + 'x', y = 11 + 'y';
  EXPECT_THAT((*tok)->Encode("axyb", false, false), ElementsAre(9, x, y, 5));
  EXPECT_EQ((*tok)->Decode({9, x, y, 5}), "axyb");
  // "\xC3\xA9" (é) is two byte tokens, and decodes back.
  EXPECT_EQ((*tok)->Decode((*tok)->Encode("\xC3\xA9", false, false)), "\xC3\xA9");
}

TEST(UgmTest, MalformedCharsmapsAreRefused) {
  struct Case {
    std::string blob;
    std::string message;
  };
  std::string no_nul = TabCharsmap(768, 0, " ");
  const Case cases[] = {
      {std::string("\x01\x00", 2), "too short for its header"},
      {TabCharsmap().replace(0, 1, "\x01"), "is not a multiple of 4"},
      {TabCharsmap(768, 0, ""), "leaves no room for the strings"},
      {TabCharsmap(300), "outside the trie of 300 units"},
      {TabCharsmap(768, 7), "names string offset 7"},
      {no_nul, "has no terminating NUL"},
  };
  for (const Case& c : cases) {
    GgufBuilder b = UgmVocab();
    Charsmap(b, c.blob);
    EXPECT_THAT(Build(b).status(), StatusIs(absl::StatusCode::kInvalidArgument, c.message))
        << c.message;
  }
  GgufBuilder b = UgmVocab();
  b.Str("tokenizer.ggml.precompiled_charsmap", "x");
  EXPECT_THAT(Build(b).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "expected an array of uint8 or int8"));
}

TEST(UgmTest, NeedsAnUnknownToken) {
  GgufBuilder b;
  b.Str("tokenizer.ggml.model", "t5").StrArray("tokenizer.ggml.tokens", {"a", "b"});
  b.Bool("tokenizer.ggml.add_eos_token", false);
  EXPECT_THAT(Build(b).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "needs an unknown token"));
}

}  // namespace
}  // namespace pd::engine
