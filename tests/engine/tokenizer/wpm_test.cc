// WordPiece tokenizer (tokenizer.ggml.model = bert) on small vocabularies built in memory: the
// word splitting and normalization, the greedy longest match, unknown words, [CLS]/[SEP], the
// normalizer keys, the bert defaults, malformed vocabularies, and the Unicode lookups it uses.
// Ids against llama.cpp: tokenizer_test (bert-bge's test vectors and the reference corpus) and
// tests/python/test_llama_vocab_vectors.py and test_pretokenizers.py (its WordPiece cases).
#include "engine/tokenizer/wpm.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"
#include "common/status_matchers.h"
#include "engine/model/gguf.h"
#include "engine/tokenizer/tokenizer.h"
#include "engine/tokenizer/unicode.h"
#include "tests/testing/gguf_builder.h"

namespace pd::engine {
namespace {

using ::pd::testing::StatusIs;
using ::testing::ElementsAre;
using testing::GgufBuilder;
using ::testing::IsEmpty;

const std::string kSp = "\xE2\x96\x81";  // U+2581, the word-start marker

absl::StatusOr<std::unique_ptr<Tokenizer>> Build(const GgufBuilder& b) {
  static auto* keep = new std::vector<std::string>();  // GgufFile borrows the bytes
  keep->push_back(b.Build());
  PD_ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> gguf, testing::ParseBytes(keep->back()));
  return Tokenizer::FromGguf(*gguf);
}

// 0 [PAD], 1 [UNK], 2 [CLS], 3 [SEP], 4 [MASK] (control), then word-start pieces and "##"
// continuations (written bare, as llama.cpp's converter writes them).
const std::vector<std::string>& Tokens() {
  // clang-format off
  static const auto* tokens = new std::vector<std::string>{
      "[PAD]",      "[UNK]",         "[CLS]",       "[SEP]",    "[MASK]",  // 0-4
      kSp + "hello", kSp + "world",  kSp + "un",    "aff",      "able",    // 5-9
      kSp + ",",     kSp + "!",      kSp + "a",     "b",        kSp + "ab",  // 10-14
      kSp + "\xE4\xB8\xAD",  // 15 ▁中
      kSp + "$",     kSp + "x",      kSp + "h\xC3\xA9llo",  // 16 ▁$, 17 ▁x, 18 ▁héllo
      kSp + "\xE1\x84\x80",  // 19 ▁ᄀ (U+1100, a Hangul leading consonant)
  };
  // clang-format on
  return *tokens;
}

GgufBuilder WpmVocab() {
  const std::vector<std::string>& tokens = Tokens();
  std::vector<int32_t> types(tokens.size(), 1);
  for (int i = 0; i < 5; ++i) types[i] = 3;
  GgufBuilder b;
  b.Str("tokenizer.ggml.model", "bert").Str("tokenizer.ggml.pre", "bert-test");
  b.StrArray("tokenizer.ggml.tokens", tokens);
  b.Array<int32_t>("tokenizer.ggml.token_type", GgufValueType::kInt32, types);
  b.U32("tokenizer.ggml.unknown_token_id", 1).U32("tokenizer.ggml.bos_token_id", 2);
  b.U32("tokenizer.ggml.seperator_token_id", 3).U32("tokenizer.ggml.padding_token_id", 0);
  return b;
}

std::unique_ptr<Tokenizer> Load(const GgufBuilder& b) {
  absl::StatusOr<std::unique_ptr<Tokenizer>> tok = Build(b);
  PD_CHECK_OK(tok.status());
  return std::move(*tok);
}

std::vector<int32_t> Ids(const Tokenizer& t, std::string_view text) {
  return t.Encode(text, false, false);
}

TEST(WpmTest, LongestPiecesFromTheStartOfEachWord) {
  const std::unique_ptr<Tokenizer> t = Load(WpmVocab());
  EXPECT_EQ(t->model(), TokenizerModel::kWpm);
  EXPECT_THAT(Ids(*t, "hello world"), ElementsAre(5, 6));
  EXPECT_THAT(Ids(*t, "unaffable"), ElementsAre(7, 8, 9));
  // Longest first: ▁ab beats ▁a, then the continuation b.
  EXPECT_THAT(Ids(*t, "abb"), ElementsAre(14, 13));
  // A word that cannot be cut to its end is the unknown token as a whole, not a partial cut.
  EXPECT_THAT(Ids(*t, "unaffablex"), ElementsAre(1));
  EXPECT_THAT(Ids(*t, "aba hello"), ElementsAre(1, 5));
  EXPECT_THAT(Ids(*t, "zzz"), ElementsAre(1));
  EXPECT_THAT(Ids(*t, ""), IsEmpty());
  EXPECT_THAT(Ids(*t, " \t\n "), IsEmpty());
}

TEST(WpmTest, SplitsPunctuationSymbolsAndIdeographs) {
  const std::unique_ptr<Tokenizer> t = Load(WpmVocab());
  EXPECT_THAT(Ids(*t, "hello,world!"), ElementsAre(5, 10, 6, 11));
  // ASCII symbols are words of their own; "$x" is two words.
  EXPECT_THAT(Ids(*t, "$x"), ElementsAre(16, 17));
  // Each CJK ideograph is a word: 中 is known, 文 is not.
  EXPECT_THAT(Ids(*t, "\xE4\xB8\xAD\xE6\x96\x87"), ElementsAre(15, 1));
  // Ideographic space (U+3000) separates words.
  EXPECT_THAT(Ids(*t, "hello\xE3\x80\x80world"), ElementsAre(5, 6));
}

TEST(WpmTest, NormalizesLikeBertBasicTokenizer) {
  const std::unique_ptr<Tokenizer> t = Load(WpmVocab());
  EXPECT_THAT(Ids(*t, "HeLLo WORLD"), ElementsAre(5, 6));
  // Accents: é is e + U+0301 in NFD; the mark goes. A precomposed and a decomposed é alike.
  EXPECT_THAT(Ids(*t, "H\xC3\xA9llo"), ElementsAre(5));
  EXPECT_THAT(Ids(*t, "He\xCC\x81llo"), ElementsAre(5));
  // Hangul syllables keep only their leading consonant (llama.cpp's first-code-point NFD).
  EXPECT_THAT(Ids(*t, "\xEA\xB0\x80"), ElementsAre(19));  // 가 -> ᄀ
  // NUL, U+FFFD, invalid bytes, format (Cf) and other control characters vanish.
  EXPECT_THAT(Ids(*t, std::string("hel\0lo", 6)), ElementsAre(5));
  EXPECT_THAT(Ids(*t, "hel\xEF\xBF\xBDlo"), ElementsAre(5));
  EXPECT_THAT(Ids(*t, "hel\xFFlo"), ElementsAre(5));
  EXPECT_THAT(Ids(*t, "hel\xE2\x80\x8Blo\x07"), ElementsAre(5));  // U+200B, BEL
  // A 4-byte form above U+10FFFF is dropped (llama.cpp aborts there).
  EXPECT_THAT(Ids(*t, "hel\xF4\x90\x80\x80lo"), ElementsAre(5));
}

TEST(WpmTest, NormalizerKeys) {
  {
    GgufBuilder b = WpmVocab();
    b.Bool("tokenizer.ggml.normalizer.lowercase", false);
    const std::unique_ptr<Tokenizer> t = Load(b);
    EXPECT_THAT(Ids(*t, "Hello hello"), ElementsAre(1, 5));
    // strip_accents follows lowercase when not given.
    EXPECT_THAT(Ids(*t, "h\xC3\xA9llo"), ElementsAre(18));
  }
  {
    GgufBuilder b = WpmVocab();
    b.Bool("tokenizer.ggml.normalizer.strip_accents", false);
    const std::unique_ptr<Tokenizer> t = Load(b);
    EXPECT_THAT(Ids(*t, "H\xC3\xA9LLO"), ElementsAre(18));
    // The combining accent is a mark, not punctuation: it stays inside the word.
    EXPECT_THAT(Ids(*t, "He\xCC\x81llo"), ElementsAre(1));
  }
  GgufBuilder b = WpmVocab();
  b.Str("tokenizer.ggml.normalizer.lowercase", "yes");
  EXPECT_THAT(Build(b).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "tokenizer.ggml.normalizer.lowercase"));
}

TEST(WpmTest, ClsAndSepWithSpecialTokens) {
  const std::unique_ptr<Tokenizer> t = Load(WpmVocab());
  EXPECT_THAT(t->Encode("hello", true, false), ElementsAre(2, 5, 3));
  EXPECT_THAT(t->Encode("", true, false), ElementsAre(2, 3));
  EXPECT_TRUE(t->add_bos());
  EXPECT_FALSE(t->add_eos());
  EXPECT_TRUE(t->add_sep());
  EXPECT_EQ(t->bos(), 2);
  EXPECT_EQ(t->sep(), 3);
  EXPECT_EQ(t->unk(), 1);
  EXPECT_EQ(t->eos(), kNoToken);
  // Special-token text is parsed only when asked; each run of text around it is split alone.
  EXPECT_THAT(t->Encode("[CLS]hello[SEP]", false, true), ElementsAre(2, 5, 3));
  EXPECT_THAT(t->Encode("a[MASK]b", false, true), ElementsAre(12, 4, 1));
  // Without parse_special, "[" and "]" are punctuation words (unknown here).
  EXPECT_THAT(t->Encode("[SEP]", false, false), ElementsAre(1, 1, 1));
  // The file's add_* keys change nothing in Encode (as in llama.cpp), only what they report.
  GgufBuilder b = WpmVocab();
  b.Bool("tokenizer.ggml.add_bos_token", false).Bool("tokenizer.ggml.add_eos_token", true);
  b.Bool("tokenizer.ggml.add_sep_token", false);
  const std::unique_ptr<Tokenizer> t2 = Load(b);
  EXPECT_THAT(t2->Encode("hello", true, false), ElementsAre(2, 5, 3));
  EXPECT_FALSE(t2->add_bos());
  EXPECT_FALSE(t2->add_sep());
}

TEST(WpmTest, DecodesWordStartsAsSpaces) {
  const std::unique_ptr<Tokenizer> t = Load(WpmVocab());
  EXPECT_EQ(t->TokenToPiece(5), " hello");
  EXPECT_EQ(t->TokenToPiece(8), "aff");
  EXPECT_EQ(t->TokenToPiece(2), "");
  EXPECT_EQ(t->TokenToPiece(2, true), "[CLS]");
  EXPECT_EQ(t->Decode({2, 7, 8, 9, 10, 6, 3}), " unaffable , world");
  DecodeOptions o;
  o.clean_spaces = t->clean_spaces_default();
  o.render_special = true;
  o.remove_special = true;  // drops the leading [CLS]; [SEP] is no EOS and stays
  EXPECT_TRUE(t->clean_spaces_default());
  EXPECT_EQ(t->Decode({2, 5, 10, 6, 11, 3}, o), " hello, world![SEP]");
}

TEST(WpmTest, BertDefaults) {
  // No special-token keys: llama.cpp's WPM defaults are BERT's ids.
  std::vector<std::string> tokens;
  for (int i = 0; i < 110; ++i) tokens.push_back(kSp + "w" + std::to_string(i));
  tokens[0] = "[PAD]";
  tokens[100] = "[UNK]";
  tokens[101] = "[CLS]";
  tokens[102] = "[SEP]";
  GgufBuilder b;
  b.Str("tokenizer.ggml.model", "bert").StrArray("tokenizer.ggml.tokens", tokens);
  const std::unique_ptr<Tokenizer> t = Load(b);
  EXPECT_EQ(t->unk(), 100);
  EXPECT_EQ(t->bos(), 101);
  EXPECT_EQ(t->sep(), 102);
  EXPECT_EQ(t->pad(), 0);
  EXPECT_EQ(t->eos(), kNoToken);
  EXPECT_THAT(t->Encode("w7 w777", true, false), ElementsAre(101, 7, 100, 102));
}

TEST(WpmTest, MalformedVocabulariesAreRefused) {
  auto bert = [](std::vector<std::string> tokens) {
    GgufBuilder b;
    b.Str("tokenizer.ggml.model", "bert").StrArray("tokenizer.ggml.tokens", tokens);
    return b;
  };
  // Too few tokens for the default ids, and no keys naming others.
  EXPECT_THAT(Build(bert({"[PAD]", "[UNK]", kSp + "a"})).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "needs an unknown token"));
  {
    GgufBuilder b = bert({"[PAD]", "[UNK]", kSp + "a"});
    b.U32("tokenizer.ggml.unknown_token_id", 1);
    EXPECT_THAT(Build(b).status(),
                StatusIs(absl::StatusCode::kInvalidArgument, "needs a [CLS] (BOS) token"));
    b.U32("tokenizer.ggml.bos_token_id", 0);
    EXPECT_THAT(Build(b).status(),
                StatusIs(absl::StatusCode::kInvalidArgument, "needs a [SEP] token"));
    b.U32("tokenizer.ggml.seperator_token_id", 0);
    PD_EXPECT_OK(Build(b).status());
  }
  EXPECT_THAT(Build(bert({})).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "tokenizer.ggml.tokens is empty"));
  {
    GgufBuilder b = bert({"[UNK]", kSp + "a"});
    b.U32("tokenizer.ggml.unknown_token_id", 0).U32("tokenizer.ggml.bos_token_id", 0);
    b.U32("tokenizer.ggml.seperator_token_id", 1000);
    EXPECT_THAT(Build(b).status(),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         "tokenizer.ggml.seperator_token_id = 1000 is out of range"));
  }
  {
    GgufBuilder b = bert({"[UNK]", "[UNK]"});
    EXPECT_THAT(Build(b).status(), StatusIs(absl::StatusCode::kInvalidArgument, "duplicate token"));
  }
}

TEST(WpmTest, OddVocabulariesDoNotCrash) {
  // Only special tokens, an empty token text (llama.cpp's [EMPTY_n] placeholder), no token with
  // the word-start marker: every word is unknown.
  GgufBuilder b;
  b.Str("tokenizer.ggml.model", "bert").StrArray("tokenizer.ggml.tokens", {"[UNK]", "", "x"});
  b.U32("tokenizer.ggml.unknown_token_id", 0).U32("tokenizer.ggml.bos_token_id", 0);
  b.U32("tokenizer.ggml.seperator_token_id", 0);
  const std::unique_ptr<Tokenizer> t = Load(b);
  EXPECT_EQ(t->token_text(1), "[EMPTY_1]");
  // [CLS], x, xx, ",", "[", empty, "_", 1, "]", [SEP]: all the unknown token.
  EXPECT_EQ(t->Encode("x xx, [EMPTY_1]", true, false), std::vector<int32_t>(10, 0));
  std::string noise;
  for (int i = 0; i < 4096; ++i) noise.push_back(static_cast<char>((i * 7919) >> 3));
  for (const int32_t id : t->Encode(noise, true, true)) EXPECT_TRUE(t->IsValid(id));
  // Words far longer than any token.
  const std::unique_ptr<Tokenizer> w = Load(WpmVocab());
  EXPECT_THAT(Ids(*w, std::string(100000, 'b')), ElementsAre(1));
  const std::vector<int32_t> ids = Ids(*w, "a" + std::string(100000, 'b'));
  ASSERT_EQ(ids.size(), 100000u);
  EXPECT_EQ(ids[0], 14);
  EXPECT_EQ(ids[99999], 13);
}

std::vector<std::string> Words(std::string_view text, bool lowercase = true,
                               bool strip_accents = true) {
  tokenizer_internal::WpmModel m;
  m.lowercase = lowercase;
  m.strip_accents = strip_accents;
  std::string norm;
  std::vector<std::pair<size_t, size_t>> spans;
  tokenizer_internal::SplitWpmWords(text, m, &norm, &spans);
  std::vector<std::string> words;
  for (const auto& [b, e] : spans) words.push_back(norm.substr(b, e - b));
  return words;
}

TEST(WpmWordsTest, SplitsAsLlamaCpp) {
  EXPECT_THAT(
      Words("\xC3\x87"
            "a va? \xE4\xB8\xAD\xE6\x96\x87"
            "ab$c d-e"),
      ElementsAre("ca", "va", "?", "\xE4\xB8\xAD", "\xE6\x96\x87", "ab", "$", "c", "d", "-", "e"));
  // Symbols above ASCII stay in words; punctuation above ASCII is split off.
  EXPECT_THAT(Words("a\xE2\x82\xAC"
                    "b a\xE2\x80\x94"
                    "b"),  // a€b a—b
              ElementsAre("a\xE2\x82\xAC"
                          "b",
                          "a", "\xE2\x80\x94", "b"));
  // U+2B820..U+2B91F are outside llama.cpp's ideograph blocks; U+2B920 is inside.
  EXPECT_THAT(Words("a\xF0\xAB\xA0\xA0"
                    "b"),
              ElementsAre("a\xF0\xAB\xA0\xA0"
                          "b"));
  EXPECT_THAT(Words("a\xF0\xAB\xA4\xA0"
                    "b"),
              ElementsAre("a", "\xF0\xAB\xA4\xA0", "b"));
  // Without lowercasing and accent stripping the text stays as it is.
  EXPECT_THAT(Words("\xC3\x87"
                    "A",
                    false, false),
              ElementsAre("\xC3\x87"
                          "A"));
  // İ: NFD's first code point is I; without accent stripping, the simple lowercase mapping
  // gives i (not i + U+0307, its full mapping).
  EXPECT_THAT(Words("\xC4\xB0"
                    "S"),
              ElementsAre("is"));
  EXPECT_THAT(Words("\xC4\xB0"
                    "S",
                    true, false),
              ElementsAre("is"));
}

TEST(UnicodeDataTest, Lookups) {
  using tokenizer_internal::CharClass;
  using tokenizer_internal::ClassOf;
  using tokenizer_internal::NfdFirst;
  using tokenizer_internal::SimpleLowercase;
  EXPECT_EQ(ClassOf('a'), CharClass::kOther);
  EXPECT_EQ(ClassOf('!'), CharClass::kPunctuation);
  EXPECT_EQ(ClassOf('$'), CharClass::kOther);  // a symbol (Sc)
  EXPECT_EQ(ClassOf(0x00), CharClass::kControl);
  EXPECT_EQ(ClassOf(0x00AD), CharClass::kControl);  // soft hyphen, Cf
  EXPECT_EQ(ClassOf(0x0301), CharClass::kMark);
  EXPECT_EQ(ClassOf(0x0378), CharClass::kOther);         // unassigned
  EXPECT_EQ(ClassOf(0xD800), CharClass::kControl);       // surrogate
  EXPECT_EQ(ClassOf(0xE000), CharClass::kControl);       // private use
  EXPECT_EQ(ClassOf(0x11B00), CharClass::kPunctuation);  // Unicode 15.0 (Devanagari Ext-A)
  EXPECT_EQ(ClassOf(0x2EBF0), CharClass::kOther);        // Unicode 15.1 (CJK Ext I), a letter
  EXPECT_EQ(ClassOf(0x10FFFF), CharClass::kOther);
  EXPECT_EQ(ClassOf(0x110000), CharClass::kOther);
  EXPECT_TRUE(tokenizer_internal::IsWhiteSpace(0x85));
  EXPECT_TRUE(tokenizer_internal::IsWhiteSpace(0x3000));
  EXPECT_FALSE(tokenizer_internal::IsWhiteSpace(0x180E));
  EXPECT_FALSE(tokenizer_internal::IsWhiteSpace(0x200B));
  EXPECT_EQ(SimpleLowercase('Q'), static_cast<uint32_t>('q'));
  EXPECT_EQ(SimpleLowercase('q'), static_cast<uint32_t>('q'));
  EXPECT_EQ(SimpleLowercase(0x0130), 0x69u);
  EXPECT_EQ(SimpleLowercase(0x0100), 0x0101u);
  EXPECT_EQ(SimpleLowercase(0x0101), 0x0101u);
  EXPECT_EQ(SimpleLowercase(0x1E9E), 0xDFu);
  EXPECT_EQ(SimpleLowercase(0x10400), 0x10428u);
  EXPECT_EQ(SimpleLowercase(0x01C5), 0x01C6u);  // titlecase ǅ
  EXPECT_EQ(NfdFirst('e'), static_cast<uint32_t>('e'));
  EXPECT_EQ(NfdFirst(0xE9), 0x65u);
  EXPECT_EQ(NfdFirst(0x1E09), 0x63u);    // ḉ: c + two marks
  EXPECT_EQ(NfdFirst(0x2126), 0x03A9u);  // Ohm sign
  EXPECT_EQ(NfdFirst(0xAC00), 0x1100u);
  EXPECT_EQ(NfdFirst(0xD7A3), 0x1112u);
  EXPECT_EQ(NfdFirst(0x01C5), 0x01C5u);  // a compatibility decomposition only
}

}  // namespace
}  // namespace pd::engine
