// Tokenizer tests: llama.cpp's test vectors for seven vocabularies, a reference corpus tokenized by
// llama.cpp itself (scripts/make_tokenizer_reference.py), round trips, streaming detokenization,
// special tokens and load errors. Run from the repository root (files are under testdata/).
#include "engine/tokenizer/tokenizer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/status.h"
#include "common/status_matchers.h"
#include "engine/model/gguf.h"
#include "engine/tokenizer/pretokenizer.h"
#include "engine/tokenizer/unicode.h"
#include "tests/testing/gguf_builder.h"

namespace pd::engine {
namespace {

using ::pd::testing::StatusIs;
using ::testing::ElementsAre;

// The vocabularies with llama.cpp test vectors.
const std::vector<std::string> kVocabs = {"bert-bge",  "deepseek-coder", "falcon",   "gpt-2",
                                          "llama-spm", "phi-3",          "starcoder"};
// Plus "BASE.PRE": vocabulary BASE with tokenizer.ggml.pre replaced by PRE (built in memory; the
// reference script builds the same variants), to cover pre-tokenizers without a test vocabulary.
const std::vector<std::string> kAllVocabs = {"bert-bge",  "deepseek-coder",  "falcon",
                                             "gpt-2",     "llama-spm",       "phi-3",
                                             "starcoder", "gpt-2.llama-bpe", "gpt-2.qwen2"};

// WordPiece lowercases, strips accents and drops spaces: its text does not come back.
bool RoundTrips(const Tokenizer& tok) { return tok.model() != TokenizerModel::kWpm; }

std::string ReadFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  EXPECT_TRUE(f.good()) << "cannot open " << path << " (run from the repository root)";
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string GgufPath(const std::string& vocab) {
  return "testdata/tokenizer/ggml-vocab-" + vocab + ".gguf";
}

std::unique_ptr<Tokenizer> LoadVariant(const std::string& base, const std::string& pre) {
  absl::StatusOr<std::unique_ptr<GgufFile>> gguf = GgufFile::Open(GgufPath(base));
  PD_CHECK_OK(gguf.status());
  const GgufFile& g = **gguf;
  testing::GgufBuilder b;
  for (const char* key : {"general.architecture", "general.name", "tokenizer.ggml.model"}) {
    b.Str(key, *g.GetString(key));
  }
  b.Str("tokenizer.ggml.pre", pre);
  for (const char* key : {"tokenizer.ggml.tokens", "tokenizer.ggml.merges"}) {
    const std::vector<std::string_view> views = *g.GetStringArray(key);
    b.StrArray(key, std::vector<std::string>(views.begin(), views.end()));
  }
  const std::vector<int64_t> types = *g.GetIntArray("tokenizer.ggml.token_type");
  b.Array<int32_t>("tokenizer.ggml.token_type", GgufValueType::kInt32,
                   std::vector<int32_t>(types.begin(), types.end()));
  for (const char* key : {"tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id"}) {
    b.U32(key, static_cast<uint32_t>(*g.GetUint(key)));
  }
  const std::string bytes = b.Build();
  absl::StatusOr<std::unique_ptr<GgufFile>> variant = testing::ParseBytes(bytes);
  PD_CHECK_OK(variant.status());
  absl::StatusOr<std::unique_ptr<Tokenizer>> tok = Tokenizer::FromGguf(**variant);
  PD_CHECK_OK(tok.status());
  return std::move(*tok);  // owns copies; the bytes may go
}

// Loads each vocabulary once per process.
const Tokenizer& Load(const std::string& vocab) {
  static auto* cache = new std::map<std::string, std::unique_ptr<Tokenizer>>();
  auto it = cache->find(vocab);
  if (it != cache->end()) return *it->second;
  std::unique_ptr<Tokenizer> tok;
  if (const size_t dot = vocab.find('.'); dot != std::string::npos) {
    tok = LoadVariant(vocab.substr(0, dot), vocab.substr(dot + 1));
  } else {
    absl::StatusOr<std::unique_ptr<GgufFile>> gguf = GgufFile::Open(GgufPath(vocab));
    PD_CHECK_OK(gguf.status());
    absl::StatusOr<std::unique_ptr<Tokenizer>> loaded = Tokenizer::FromGguf(**gguf);
    PD_CHECK_OK(loaded.status());
    tok = std::move(*loaded);
  }
  return *cache->emplace(vocab, std::move(tok)).first->second;
}

std::string Join(const std::vector<int32_t>& ids) {
  std::string s;
  for (int32_t id : ids) s += " " + std::to_string(id);
  return s;
}

std::string Hex(std::string_view s) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (unsigned char c : s) {
    out.push_back(kHex[c >> 4]);
    out.push_back(kHex[c & 15]);
  }
  return out;
}

std::string Unhex(std::string_view h) {
  auto nib = [](char c) { return c <= '9' ? c - '0' : c - 'a' + 10; };
  std::string out;
  for (size_t i = 0; i + 1 < h.size(); i += 2) {
    out.push_back(static_cast<char>(nib(h[i]) * 16 + nib(h[i + 1])));
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// llama.cpp's test vectors (models/ggml-vocab-*.gguf.inp/.out, as used by test-tokenizer-0):
// cases are separated by "\n__ggml_vocab_test__\n" (so a case keeps its own trailing newlines and
// the file's last separator leaves an empty remainder, which is not a case); each .out line holds
// the ids, tokenized without special tokens and without parsing special tokens.

struct VectorCase {
  std::string text;
  std::vector<int32_t> ids;
};

std::vector<VectorCase> ReadVectors(const std::string& vocab) {
  const std::string inp = ReadFile(GgufPath(vocab) + ".inp");
  const std::string outp = ReadFile(GgufPath(vocab) + ".out");
  const std::string sep = "\n__ggml_vocab_test__\n";
  std::vector<std::string> texts;
  size_t pos = 0;
  while (pos < inp.size()) {
    const size_t hit = inp.find(sep, pos);
    if (hit == std::string::npos) {
      texts.push_back(inp.substr(pos));
      break;
    }
    texts.push_back(inp.substr(pos, hit - pos));
    pos = hit + sep.size();
  }
  std::vector<VectorCase> cases;
  std::istringstream lines(outp);
  std::string line;
  for (const std::string& t : texts) {
    EXPECT_TRUE(std::getline(lines, line)) << "fewer .out lines than cases";
    VectorCase c{t, {}};
    std::istringstream nums(line);
    int32_t id;
    while (nums >> id) c.ids.push_back(id);
    cases.push_back(std::move(c));
  }
  return cases;
}

class VectorTest : public ::testing::TestWithParam<std::string> {};
class VocabTest : public ::testing::TestWithParam<std::string> {};

TEST_P(VectorTest, MatchesLlamaCppTestVectors) {
  const Tokenizer& tok = Load(GetParam());
  const std::vector<VectorCase> cases = ReadVectors(GetParam());
  ASSERT_EQ(cases.size(), 46u);
  int pass = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::vector<int32_t> got = tok.Encode(cases[i].text, false, false);
    if (got == cases[i].ids) {
      ++pass;
    } else {
      ADD_FAILURE() << GetParam() << " case " << i << " text hex " << Hex(cases[i].text)
                    << "\n  want" << Join(cases[i].ids) << "\n  got " << Join(got);
    }
  }
  std::printf("[ vectors  ] %-15s %d/%zu cases match\n", GetParam().c_str(), pass, cases.size());
}

TEST_P(VectorTest, TestVectorsRoundTrip) {
  const Tokenizer& tok = Load(GetParam());
  if (!RoundTrips(tok)) GTEST_SKIP() << "WordPiece normalizes the text";
  for (const VectorCase& c : ReadVectors(GetParam())) {
    EXPECT_EQ(tok.Decode(tok.Encode(c.text, false, false)), c.text) << Hex(c.text);
  }
}

// ---------------------------------------------------------------------------------------------
// Reference corpus: testdata/tokenizer/corpus.jsonl tokenized by llama.cpp
// (scripts/make_tokenizer_reference.py -> testdata/tokenizer/reference/). The files are written by
// that script in a fixed shape, so a few string searches are enough to read them.

// The value text after "key": in a one-line JSON object, or "" if absent.
std::string_view JsonValue(std::string_view line, std::string_view key) {
  const std::string pat = "\"" + std::string(key) + "\": ";
  const size_t at = line.find(pat);
  if (at == std::string_view::npos) return {};
  return line.substr(at + pat.size());
}

std::vector<int32_t> JsonInts(std::string_view line, std::string_view key) {
  std::string_view v = JsonValue(line, key);
  std::vector<int32_t> out;
  if (v.empty() || v[0] != '[') return out;
  const size_t end = v.find(']');
  std::string body(v.substr(1, end - 1));
  for (char& c : body) {
    if (c == ',') c = ' ';
  }
  std::istringstream nums(body);
  int64_t x;
  while (nums >> x) out.push_back(static_cast<int32_t>(x));
  return out;
}

std::string JsonString(std::string_view line, std::string_view key) {
  std::string_view v = JsonValue(line, key);
  if (v.empty() || v[0] != '"') return {};
  return std::string(v.substr(1, v.find('"', 1) - 1));
}

int64_t JsonInt(std::string_view line, std::string_view key) {
  return std::stoll(std::string(JsonValue(line, key)));
}

bool JsonBool(std::string_view line, std::string_view key) {
  return JsonValue(line, key).substr(0, 4) == "true";
}

std::vector<std::string> ReadLines(const std::string& path) {
  std::vector<std::string> lines;
  std::istringstream in(ReadFile(path));
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty()) lines.push_back(line);
  }
  return lines;
}

struct CorpusEntry {
  int64_t id;
  std::string note;
  std::string text;
};

const std::vector<CorpusEntry>& Corpus() {
  static const auto* corpus = [] {
    auto* c = new std::vector<CorpusEntry>();
    for (const std::string& line : ReadLines("testdata/tokenizer/corpus.jsonl")) {
      c->push_back({JsonInt(line, "id"), JsonString(line, "note"), Unhex(JsonString(line, "hex"))});
    }
    return c;
  }();
  return *corpus;
}

TEST(CorpusTest, HasEnoughStrings) {
  EXPECT_GE(Corpus().size(), 300u);
  int invalid = 0;
  for (const CorpusEntry& e : Corpus()) {
    invalid += tokenizer_internal::SanitizeUtf8(e.text) != e.text;
  }
  EXPECT_GE(invalid, 40) << "the corpus should keep its invalid UTF-8 strings";
}

TEST_P(VocabTest, MatchesLlamaCppOnReferenceCorpus) {
  const Tokenizer& tok = Load(GetParam());
  const std::vector<std::string> ref =
      ReadLines("testdata/tokenizer/reference/" + GetParam() + ".jsonl");
  const std::vector<CorpusEntry>& corpus = Corpus();
  ASSERT_EQ(ref.size(), corpus.size()) << "regenerate with scripts/make_tokenizer_reference.py";
  int n = 0, aborts = 0, ok_ids = 0, ok_special = 0, ok_parse = 0, ok_detok = 0, reported = 0;
  DecodeOptions llama_detok;
  llama_detok.clean_spaces = tok.clean_spaces_default();
  for (size_t i = 0; i < ref.size(); ++i) {
    const CorpusEntry& e = corpus[i];
    ASSERT_EQ(JsonInt(ref[i], "id"), e.id);
    const std::vector<int32_t> ids = tok.Encode(e.text, false, false);
    if (JsonBool(ref[i], "crash")) {
      // llama.cpp aborts on these (4-byte forms above U+10FFFF); we must not, and give one U+FFFD
      // for each such form (WordPiece drops it).
      ++aborts;
      if (tok.model() != TokenizerModel::kWpm) {
        EXPECT_FALSE(ids.empty()) << e.note << " " << Hex(e.text);
      }
      continue;
    }
    ++n;
    const std::vector<int32_t> want = JsonInts(ref[i], "ids");
    const std::vector<int32_t> want_special = JsonInts(ref[i], "ids_special");
    const std::vector<int32_t> want_parse = JsonInts(ref[i], "ids_parse");
    const std::string want_detok = Unhex(JsonString(ref[i], "detok"));
    const std::vector<int32_t> got_special = tok.Encode(e.text, true, false);
    const std::vector<int32_t> got_parse = tok.Encode(e.text, false, true);
    const std::string got_detok = tok.Decode(want, llama_detok);
    ok_ids += ids == want;
    ok_special += got_special == want_special;
    ok_parse += got_parse == want_parse;
    ok_detok += got_detok == want_detok;
    const bool all = ids == want && got_special == want_special && got_parse == want_parse &&
                     got_detok == want_detok;
    if (!all && reported++ < 20) {
      ADD_FAILURE() << GetParam() << " corpus #" << e.id << " (" << e.note << ") hex "
                    << Hex(e.text) << "\n  ids      want" << Join(want) << "\n           got "
                    << Join(ids) << "\n  special  want" << Join(want_special) << "\n           got "
                    << Join(got_special) << "\n  parse    want" << Join(want_parse)
                    << "\n           got " << Join(got_parse) << "\n  detok    want "
                    << Hex(want_detok) << "\n           got  " << Hex(got_detok);
    }
  }
  std::printf(
      "[ corpus   ] %-15s %d strings: ids %d/%d, add_special %d/%d, parse_special %d/%d, "
      "detokenize %d/%d; %d more where llama.cpp aborts\n",
      GetParam().c_str(), n, ok_ids, n, ok_special, n, ok_parse, n, ok_detok, n, aborts);
  EXPECT_EQ(ok_ids, n);
  EXPECT_EQ(ok_special, n);
  EXPECT_EQ(ok_parse, n);
  EXPECT_EQ(ok_detok, n);
}

uint64_t Fnv1a64(std::string_view data, uint64_t h = 0xCBF29CE484222325ull) {
  for (unsigned char c : data) h = (h ^ c) * 0x100000001B3ull;
  return h;
}

TEST_P(VocabTest, MatchesLlamaCppVocabularyMetadata) {
  const Tokenizer& tok = Load(GetParam());
  std::string meta;
  for (const std::string& line :
       ReadLines("testdata/tokenizer/reference/" + GetParam() + ".meta.json")) {
    meta += line;
  }
  EXPECT_EQ(tok.n_vocab(), JsonInt(meta, "n_vocab"));
  EXPECT_EQ(tok.bos(), JsonInt(meta, "bos"));
  EXPECT_EQ(tok.eos(), JsonInt(meta, "eos"));
  EXPECT_EQ(tok.eot(), JsonInt(meta, "eot"));
  EXPECT_EQ(tok.add_bos(), JsonBool(meta, "add_bos"));
  EXPECT_EQ(tok.add_eos(), JsonBool(meta, "add_eos"));
  EXPECT_EQ(tok.eog_ids(), JsonInts(meta, "eog"));
  // "attrs": [[id, attr], ...] for every token that is not plainly normal.
  std::string_view attrs = JsonValue(meta, "attrs");
  std::vector<std::pair<int32_t, uint32_t>> want, got;
  std::string body(attrs.substr(0, attrs.find("]]") + 2));
  for (char& c : body) {
    if (c == '[' || c == ']' || c == ',') c = ' ';
  }
  std::istringstream nums(body);
  int64_t id, a;
  while (nums >> id >> a) want.emplace_back(static_cast<int32_t>(id), static_cast<uint32_t>(a));
  for (int32_t i = 0; i < tok.n_vocab(); ++i) {
    if (tok.token_attrs(i) != TokenAttr::kNormal) got.emplace_back(i, tok.token_attrs(i));
  }
  EXPECT_EQ(got, want);
  for (const bool special : {false, true}) {
    uint64_t h = 0xCBF29CE484222325ull;
    for (int32_t i = 0; i < tok.n_vocab(); ++i) {
      const std::string p = tok.TokenToPiece(i, special);
      const uint32_t len = static_cast<uint32_t>(p.size());
      const char len_le[4] = {static_cast<char>(len), static_cast<char>(len >> 8),
                              static_cast<char>(len >> 16), static_cast<char>(len >> 24)};
      h = Fnv1a64(p, Fnv1a64(std::string_view(len_le, 4), h));
    }
    char hex[17];
    std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(h));
    EXPECT_EQ(hex, JsonString(meta, special ? "pieces_fnv1a64_special" : "pieces_fnv1a64"))
        << "token pieces differ (render_special=" << special << ")";
  }
}

// ---------------------------------------------------------------------------------------------
// Round trips and streaming

bool HasSpecialText(const std::string& s) {
  return s.find('<') != std::string::npos || s.find('[') != std::string::npos;
}

TEST_P(VocabTest, DecodeInvertsEncodeOnValidUtf8) {
  const Tokenizer& tok = Load(GetParam());
  if (!RoundTrips(tok)) GTEST_SKIP() << "WordPiece normalizes the text";
  int checked = 0;
  for (const CorpusEntry& e : Corpus()) {
    if (HasSpecialText(e.text) || tokenizer_internal::SanitizeUtf8(e.text) != e.text) continue;
    // Falcon's vocabulary has no token for some ASCII control bytes (\v, \x1c...); llama.cpp
    // drops them, and so do we.
    bool representable = true;
    for (unsigned char c : e.text) {
      const std::string one(1, static_cast<char>(c));
      if (c < 0x80 && tok.Decode(tok.Encode(one, false, false)) != one) representable = false;
    }
    if (!representable) continue;
    // SPM reads U+2581 as a space.
    if (tok.model() == TokenizerModel::kSpm && e.text.find("\xE2\x96\x81") != std::string::npos) {
      continue;
    }
    ++checked;
    EXPECT_EQ(tok.Decode(tok.Encode(e.text, false, false)), e.text)
        << "#" << e.id << " " << e.note << " " << Hex(e.text);
  }
  EXPECT_GT(checked, 300);
}

TEST(RoundTripTest, SpmKeepsInvalidBytes) {
  // SentencePiece byte fallback round-trips invalid UTF-8 too...
  const Tokenizer& tok = Load("llama-spm");
  int checked = 0;
  for (const CorpusEntry& e : Corpus()) {
    if (HasSpecialText(e.text) || e.text.find(' ') != std::string::npos ||
        e.text.find("\xE2\x96\x81") != std::string::npos) {
      continue;
    }
    ++checked;
    EXPECT_EQ(tok.Decode(tok.Encode(e.text, false, false)), e.text) << Hex(e.text);
  }
  EXPECT_GT(checked, 250);
  // ... except where llama.cpp's symbol split (by lead byte, unvalidated) lets an invalid lead
  // byte swallow the first bytes of an escaped space: those come back as U+2581, not a space.
  const std::vector<int32_t> ids = tok.Encode("a\xFF b", false, false);
  EXPECT_THAT(ids, ElementsAre(263, 258, 229, 153, 132, 29890));
  EXPECT_EQ(tok.Decode(ids),
            "a\xFF\xE2\x96\x81"
            "b");
  // And, as in SentencePiece, a literal U+2581 in the input is a space.
  EXPECT_EQ(tok.Decode(tok.Encode("\xE2\x96\x81x", false, false)), " x");
}

TEST(RoundTripTest, BpeNormalisesInvalidUtf8LikeLlamaCpp) {
  const Tokenizer& tok = Load("gpt-2");
  EXPECT_EQ(tok.Decode(tok.Encode("a\xff"
                                  "b",
                                  false, false)),
            "a\xEF\xBF\xBD"
            "b");
  EXPECT_EQ(tok.Decode(tok.Encode("\xC0\x80x", false, false)), std::string("\0x", 2));  // overlong
  EXPECT_EQ(tok.Decode(tok.Encode("\xED\xA0\x80", false, false)), "\xED\xA0\x80");      // surrogate
  // llama.cpp aborts on forms above U+10FFFF; we give one U+FFFD per form.
  EXPECT_EQ(tok.Decode(tok.Encode("\xF4\x90\x80\x80!", false, false)), "\xEF\xBF\xBD!");
  EXPECT_EQ(tok.Decode(tok.Encode("\xF7\xBF\xBF\xBF", false, false)), "\xEF\xBF\xBD");
}

TEST(DecodeTest, SpmStripsTheFirstLeadingSpaceOnlyWithoutBos) {
  const Tokenizer& tok = Load("llama-spm");
  const std::vector<int32_t> hello = tok.Encode("Hello world", false, false);
  EXPECT_THAT(hello, ElementsAre(15043, 3186));
  EXPECT_EQ(tok.Decode(hello), "Hello world");
  EXPECT_EQ(tok.TokenToPiece(15043), " Hello");
  // With BOS first, nothing is stripped (llama.cpp's llama_detokenize does the same).
  const std::vector<int32_t> with_bos = tok.Encode("Hello world", true, false);
  EXPECT_THAT(with_bos, ElementsAre(1, 15043, 3186));
  EXPECT_EQ(tok.Decode(with_bos), " Hello world");
  DecodeOptions opts;
  opts.remove_special = true;
  EXPECT_EQ(tok.Decode(with_bos, opts), " Hello world");
  opts.render_special = true;
  opts.remove_special = false;
  EXPECT_EQ(tok.Decode(with_bos, opts), "<s> Hello world");
  // BPE vocabularies add no space prefix, so nothing is stripped.
  const Tokenizer& gpt2 = Load("gpt-2");
  EXPECT_EQ(gpt2.Decode(gpt2.Encode(" Hello", false, false)), " Hello");
}

TEST(DecodeTest, CleanSpacesAsLlamaCpp) {
  const Tokenizer& tok = Load("gpt-2");
  const std::vector<int32_t> ids = tok.Encode("Hello , world ! It 's ok .", false, false);
  EXPECT_EQ(tok.Decode(ids), "Hello , world ! It 's ok .");
  DecodeOptions opts;
  opts.clean_spaces = true;
  EXPECT_EQ(tok.Decode(ids, opts), "Hello, world! It's ok.");
  EXPECT_TRUE(tok.clean_spaces_default());
  EXPECT_FALSE(Load("deepseek-coder").clean_spaces_default());
}

TEST(DecodeTest, OutOfRangeIdsAreSkipped) {
  const Tokenizer& tok = Load("gpt-2");
  EXPECT_EQ(tok.TokenToPiece(-1), "");
  EXPECT_EQ(tok.TokenToPiece(tok.n_vocab()), "");
  EXPECT_EQ(tok.Decode({15496, -5, 1 << 30, 995}), "Hello world");
  EXPECT_FALSE(tok.IsEog(-1));
  EXPECT_FALSE(tok.IsControl(tok.n_vocab()));
}

std::vector<std::string> StreamPieces(const Tokenizer& tok, const std::vector<int32_t>& ids,
                                      StreamingDetokenizer::Options opts = {}) {
  StreamingDetokenizer stream(tok, opts);
  std::vector<std::string> out;
  for (int32_t id : ids) out.push_back(stream.Push(id));
  out.push_back(stream.Flush());
  return out;
}

TEST(StreamingTest, HoldsBackSplitMultiByteCharacters) {
  const Tokenizer& tok = Load("llama-spm");
  // The rocket is not in the vocabulary: SPM spells it with four byte tokens.
  const std::vector<int32_t> ids = tok.Encode("\xF0\x9F\x9A\x80!", false, false);
  ASSERT_THAT(ids, ElementsAre(29871, 243, 162, 157, 131, 29991));
  EXPECT_THAT(StreamPieces(tok, ids), ElementsAre(" ", "", "", "", "\xF0\x9F\x9A\x80", "!", ""));
  StreamingDetokenizer::Options strip;
  strip.strip_leading_space = true;
  EXPECT_THAT(StreamPieces(tok, ids, strip),
              ElementsAre("", "", "", "", "\xF0\x9F\x9A\x80", "!", ""));
}

TEST(StreamingTest, ZwjEmojiArrivesWhole) {
  const Tokenizer& tok = Load("gpt-2");
  const std::string family =
      "\xF0\x9F\x91\xA8\xE2\x80\x8D\xF0\x9F\x91\xA9\xE2\x80\x8D\xF0\x9F\x91\xA7";
  const std::vector<int32_t> ids = tok.Encode(family, false, false);
  ASSERT_GT(ids.size(), 3u);
  std::string all;
  int held = 0;
  StreamingDetokenizer stream(tok);
  for (int32_t id : ids) {
    const std::string piece = stream.Push(id);
    EXPECT_EQ(tokenizer_internal::SanitizeUtf8(piece), piece) << "broken UTF-8 emitted";
    held += stream.pending_bytes() > 0;
    all += piece;
  }
  all += stream.Flush();
  EXPECT_GT(held, 0) << "some token should end inside a character";
  EXPECT_EQ(all, family);
}

TEST(StreamingTest, IncompleteTailFlushesAsReplacementCharacter) {
  const Tokenizer& tok = Load("llama-spm");
  StreamingDetokenizer stream(tok);
  EXPECT_EQ(stream.Push(243), "");  // <0xF0>
  EXPECT_EQ(stream.Push(162), "");  // <0x9F>
  EXPECT_EQ(stream.pending_bytes(), 2u);
  EXPECT_EQ(stream.Flush(), "\xEF\xBF\xBD");
  EXPECT_EQ(stream.pending_bytes(), 0u);
  EXPECT_EQ(stream.Flush(), "");
}

TEST(StreamingTest, InvalidBytesAreReplacedAtOnce) {
  const Tokenizer& tok = Load("llama-spm");
  StreamingDetokenizer stream(tok);
  EXPECT_EQ(stream.Push(258), "\xEF\xBF\xBD");  // <0xFF> can never start a character
  EXPECT_EQ(stream.Push(243), "");              // <0xF0> might
  EXPECT_EQ(stream.Push(68),
            "\xEF\xBF\xBD"
            "A");  // ... but "A" ends it
  EXPECT_EQ(stream.Flush(), "");
}

TEST_P(VocabTest, StreamingEqualsSanitizedDecode) {
  const Tokenizer& tok = Load(GetParam());
  StreamingDetokenizer::Options opts;
  opts.strip_leading_space = true;  // to compare with Decode()
  for (const CorpusEntry& e : Corpus()) {
    const std::vector<int32_t> ids = tok.Encode(e.text, false, false);
    std::string streamed;
    for (const std::string& piece : StreamPieces(tok, ids, opts)) {
      ASSERT_EQ(tokenizer_internal::SanitizeUtf8(piece), piece) << "broken UTF-8 emitted";
      streamed += piece;
    }
    EXPECT_EQ(streamed, tokenizer_internal::SanitizeUtf8(tok.Decode(ids))) << Hex(e.text);
  }
}

// ---------------------------------------------------------------------------------------------
// Special tokens

TEST(SpecialTokenTest, ParsesControlTokensOnlyWhenAsked) {
  const Tokenizer& spm = Load("llama-spm");
  // After a special token the text gets the SentencePiece space prefix again.
  EXPECT_THAT(spm.Encode("<s>Hello", false, true), ElementsAre(1, 15043));
  const std::vector<int32_t> plain = spm.Encode("<s>Hello", false, false);
  EXPECT_EQ(std::count(plain.begin(), plain.end(), 1), 0);
  EXPECT_EQ(spm.Decode(plain), "<s>Hello");

  const Tokenizer& gpt2 = Load("gpt-2");
  EXPECT_THAT(gpt2.Encode("Hello<|endoftext|>", false, true), ElementsAre(15496, 50256));
  const std::vector<int32_t> text = gpt2.Encode("Hello<|endoftext|>", false, false);
  EXPECT_EQ(std::count(text.begin(), text.end(), 50256), 0);
  EXPECT_EQ(gpt2.Decode(text), "Hello<|endoftext|>");
}

TEST(SpecialTokenTest, Phi3SpecialTokensEatTheWhitespaceAfterThem) {
  const Tokenizer& tok = Load("phi-3");
  EXPECT_EQ(tok.Encode("<|user|>   Hi", false, true), tok.Encode("<|user|>Hi", false, true));
  EXPECT_EQ(tok.Encode("<|user|>Hi", false, true).front(), 32010);
  EXPECT_TRUE(tok.token_attrs(32010) & TokenAttr::kRstrip);
  // <|endoftext|> is exempt, as in llama.cpp.
  EXPECT_FALSE(tok.token_attrs(32000) & TokenAttr::kRstrip);
}

TEST(SpecialTokenTest, UserDefinedTokensAreAlwaysRecognised) {
  const Tokenizer& tok = Load("deepseek-coder");
  int checked = 0;
  for (int32_t id = 0; id < tok.n_vocab(); ++id) {
    if (tok.token_type(id) != TokenType::kUserDefined || tok.IsControl(id)) continue;
    EXPECT_THAT(tok.Encode(tok.token_text(id), false, false), ElementsAre(id));
    EXPECT_EQ(tok.TokenToPiece(id), tok.token_text(id));  // rendered as written
    ++checked;
  }
  EXPECT_GT(checked, 5);
}

TEST(SpecialTokenTest, EndOfGeneration) {
  const Tokenizer& phi3 = Load("phi-3");
  EXPECT_EQ(phi3.eos(), 32000);
  EXPECT_EQ(phi3.eot(), 32007);  // <|end|>
  EXPECT_TRUE(phi3.IsEog(32000));
  EXPECT_TRUE(phi3.IsEog(32007));
  EXPECT_FALSE(phi3.IsEog(1));
  EXPECT_TRUE(phi3.IsControl(32007));
  EXPECT_EQ(phi3.TokenToPiece(32007), "");
  EXPECT_EQ(phi3.TokenToPiece(32007, /*render_special=*/true), "<|end|>");
  EXPECT_TRUE(Load("gpt-2").IsEog(50256));
  EXPECT_TRUE(Load("starcoder").IsEog(0));
  EXPECT_EQ(Load("llama-spm").eog_ids(), std::vector<int32_t>({2}));
}

TEST(SpecialTokenTest, AddSpecialFollowsTheModel) {
  EXPECT_THAT(Load("llama-spm").Encode("", true, false), ElementsAre(1));
  EXPECT_THAT(Load("llama-spm").Encode("", false, false), ElementsAre());
  EXPECT_THAT(Load("deepseek-coder").Encode("Hi", true, false).front(), 32013);
  EXPECT_THAT(Load("gpt-2").Encode("Hi", true, false), ElementsAre(17250));  // GPT-2 adds nothing
  EXPECT_EQ(Load("llama-spm").token_type(1), TokenType::kControl);
  EXPECT_EQ(Load("llama-spm").token_type(13), TokenType::kByte);
  EXPECT_EQ(Load("llama-spm").TokenToPiece(13), "\n");
}

// ---------------------------------------------------------------------------------------------
// Synthetic vocabularies and load errors

using testing::GgufBuilder;

struct Vocab {
  std::vector<std::string> tokens;
  std::vector<float> scores;
  std::vector<int32_t> types;
};

// The GPT-2 byte-level spelling of `s`.
std::string ByteLevel(std::string_view s) {
  std::string out;
  for (unsigned char c : s) out += tokenizer_internal::ByteToUnicodeUtf8(c);
  return out;
}

GgufBuilder BpeVocab(std::string_view pre = "gpt-2") {
  GgufBuilder b;
  b.Str("tokenizer.ggml.model", "gpt2").Str("tokenizer.ggml.pre", pre);
  b.StrArray("tokenizer.ggml.tokens", {"a", "b", "c", "ab", "abc", ByteLevel(" "),
                                       ByteLevel(" ") + "abc", "<x>", "<x><y>", "<eos>"});
  b.Array<int32_t>("tokenizer.ggml.token_type", GgufValueType::kInt32,
                   {1, 1, 1, 1, 1, 1, 1, 4, 4, 3});
  b.StrArray("tokenizer.ggml.merges", {"a b", "ab c", ByteLevel(" ") + " abc"});
  b.U32("tokenizer.ggml.eos_token_id", 9);
  return b;
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Build(const GgufBuilder& b) {
  static auto* keep = new std::vector<std::string>();  // GgufFile borrows the bytes
  keep->push_back(b.Build());
  PD_ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> gguf, testing::ParseBytes(keep->back()));
  return Tokenizer::FromGguf(*gguf);
}

// jina-v1-en, jina-v2-code and roberta-bpe: GPT-2's split, with add_sep on. The separator is for
// callers that join two texts; Encode() adds none, as llama.cpp's llama_tokenize adds none.
TEST(SyntheticTest, AddSepRowsSplitLikeGpt2) {
  absl::StatusOr<std::unique_ptr<Tokenizer>> gpt2 = Build(BpeVocab());
  ASSERT_TRUE(gpt2.ok()) << gpt2.status();
  EXPECT_FALSE((*gpt2)->add_sep());
  EXPECT_EQ((*gpt2)->sep(), kNoToken);
  const std::string text = "abc ab, c <x><y> abcabc\n";
  for (const char* pre : {"jina-v1-en", "jina-v2-code", "roberta-bpe"}) {
    absl::StatusOr<std::unique_ptr<Tokenizer>> tok =
        Build(BpeVocab(pre).U32("tokenizer.ggml.seperator_token_id", 9));
    ASSERT_TRUE(tok.ok()) << pre << ": " << tok.status();
    EXPECT_TRUE((*tok)->add_sep()) << pre;
    EXPECT_EQ((*tok)->sep(), 9) << pre;
    for (const bool add_special : {false, true}) {
      EXPECT_EQ((*tok)->Encode(text, add_special, false), (*gpt2)->Encode(text, add_special, false))
          << pre;
    }
  }
  // The key wins over the row; a vocabulary without a separator still loads (nothing to add).
  absl::StatusOr<std::unique_ptr<Tokenizer>> off =
      Build(BpeVocab("roberta-bpe").Bool("tokenizer.ggml.add_sep_token", false));
  ASSERT_TRUE(off.ok()) << off.status();
  EXPECT_FALSE((*off)->add_sep());
  EXPECT_EQ((*off)->sep(), kNoToken);
  absl::StatusOr<std::unique_ptr<Tokenizer>> on =
      Build(BpeVocab().Bool("tokenizer.ggml.add_sep_token", true));
  ASSERT_TRUE(on.ok()) << on.status();
  EXPECT_TRUE((*on)->add_sep());
}

TEST(SyntheticTest, VocabularyOnlyBpeLoadsAndMerges) {
  absl::StatusOr<std::unique_ptr<Tokenizer>> tok = Build(BpeVocab());
  PD_ASSERT_OK(tok);
  EXPECT_EQ((*tok)->model(), TokenizerModel::kBpe);
  EXPECT_THAT((*tok)->Encode("abc", false, false), ElementsAre(4));
  EXPECT_THAT((*tok)->Encode("abc abc", false, false), ElementsAre(4, 6));
  EXPECT_THAT((*tok)->Encode("ab", false, false), ElementsAre(3));
  EXPECT_THAT((*tok)->Encode("ba", false, false), ElementsAre(1, 0));
  // The longer of two overlapping user-defined tokens wins.
  EXPECT_THAT((*tok)->Encode("<x><y>a<x>", false, false), ElementsAre(8, 0, 7));
  EXPECT_EQ((*tok)->Decode({4, 6}), "abc abc");
  EXPECT_TRUE((*tok)->IsEog(9));
  EXPECT_EQ((*tok)->bos(), kNoToken);  // the default id 11 does not exist in 10 tokens
}

TEST(SyntheticTest, SpmByteFallbackAndScores) {
  GgufBuilder b;
  std::vector<std::string> tokens = {"<unk>", "<s>", "</s>"};
  std::vector<float> scores = {0, 0, 0};
  std::vector<int32_t> types = {2, 3, 3};
  for (int i = 0; i < 256; ++i) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", i);
    tokens.push_back(name);
    scores.push_back(0);
    types.push_back(6);
  }
  for (const char* t : {"\xE2\x96\x81", "a", "b",
                        "\xE2\x96\x81"
                        "a",
                        "ab",
                        "\xE2\x96\x81"
                        "ab"}) {
    tokens.push_back(t);
    scores.push_back(-static_cast<float>(tokens.size()));  // later tokens merge later
    types.push_back(1);
  }
  const int32_t sp = 259, a = 260, bb = 261, sp_a = 262, sp_ab = 264;
  b.Str("tokenizer.ggml.model", "llama").StrArray("tokenizer.ggml.tokens", tokens);
  b.Array<float>("tokenizer.ggml.scores", GgufValueType::kFloat32, scores);
  b.Array<int32_t>("tokenizer.ggml.token_type", GgufValueType::kInt32, types);
  absl::StatusOr<std::unique_ptr<Tokenizer>> tok = Build(b);
  PD_ASSERT_OK(tok);
  EXPECT_THAT((*tok)->Encode("ab", false, false), ElementsAre(sp_ab));
  EXPECT_THAT((*tok)->Encode("ab", true, false), ElementsAre(1, sp_ab));
  EXPECT_THAT((*tok)->Encode("ba", false, false), ElementsAre(sp, bb, a));
  EXPECT_THAT((*tok)->Encode("a\n", false, false), ElementsAre(sp_a, 3 + '\n'));
  EXPECT_THAT((*tok)->Encode("\xFF"
                             "b",
                             false, false),
              ElementsAre(sp, 3 + 0xFF, 3 + 'b'));
  EXPECT_EQ((*tok)->Decode((*tok)->Encode(" ab\xFF", false, false)), " ab\xFF");
}

TEST(SyntheticTest, SpmMergesAcrossSpacesWhenAVocabularyAllowsIt) {
  // With a token holding U+2581 inside, runs cannot be split at spaces: the whole text is merged
  // at once (the slower general path).
  GgufBuilder b;
  b.Str("tokenizer.ggml.model", "llama");
  b.StrArray("tokenizer.ggml.tokens", {"<unk>", "<s>", "</s>", "\xE2\x96\x81", "a", "b",
                                       "\xE2\x96\x81"
                                       "a",
                                       "a\xE2\x96\x81",
                                       "a\xE2\x96\x81"
                                       "b"});
  b.Array<float>("tokenizer.ggml.scores", GgufValueType::kFloat32,
                 {0, 0, 0, -1, -1, -1, -3, -2, -1});
  absl::StatusOr<std::unique_ptr<Tokenizer>> tok = Build(b);
  PD_ASSERT_OK(tok);
  // "▁a▁b": "a▁" (-2) beats "▁a" (-3), then "a▁b" (-1) forms.
  EXPECT_THAT((*tok)->Encode("a b", false, false), ElementsAre(3, 8));
  EXPECT_EQ((*tok)->Decode({3, 8}), "a b");
}

TEST(ThreadTest, ConcurrentEncodeGivesTheSameIds) {
  const Tokenizer& bpe = Load("gpt-2");
  const Tokenizer& spm = Load("llama-spm");
  std::vector<std::vector<int32_t>> want_bpe, want_spm;
  for (const CorpusEntry& e : Corpus()) {
    want_bpe.push_back(bpe.Encode(e.text, true, true));
    want_spm.push_back(spm.Encode(e.text, true, true));
  }
  std::atomic<int> mismatches{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 3; ++round) {
        for (size_t i = t; i < Corpus().size(); i += 2) {
          mismatches += bpe.Encode(Corpus()[i].text, true, true) != want_bpe[i];
          mismatches += spm.Encode(Corpus()[i].text, true, true) != want_spm[i];
        }
      }
    });
  }
  for (std::thread& th : threads) th.join();
  EXPECT_EQ(mismatches.load(), 0);
}

// Every row of the table compiles and loads (its splitting is checked against llama.cpp in
// tests/python/test_pretokenizers.py).
TEST(PreTokenizerTableTest, EveryNameLoadsAndSplits) {
  const std::vector<std::string_view> names = tokenizer_internal::SupportedPreTokenizers();
  EXPECT_GE(names.size(), 80u);
  for (std::string_view name : names) {
    absl::StatusOr<std::unique_ptr<Tokenizer>> tok =
        Build(BpeVocab(std::string(name)).U32("tokenizer.ggml.bos_token_id", 9));
    ASSERT_TRUE(tok.ok()) << name << ": " << tok.status();
    EXPECT_FALSE((*tok)->Encode("Hello abc, world 12345 \xe4\xbd\xa0\xe5\xa5\xbd!", false, false).empty())
        << name;
  }
}

TEST(LoadErrorTest, ReportsBadMetadata) {
  auto expect_invalid = [](const GgufBuilder& b, const std::string& what) {
    EXPECT_THAT(Build(b), StatusIs(absl::StatusCode::kInvalidArgument, what)) << what;
  };
  expect_invalid(GgufBuilder().U32("general.alignment", 32), "tokenizer.ggml.model is missing");
  expect_invalid(GgufBuilder().Str("tokenizer.ggml.model", "rwkv"),
                 "unsupported tokenizer.ggml.model 'rwkv'");
  expect_invalid(BpeVocab("no-such-pre"), "unknown tokenizer.ggml.pre 'no-such-pre'");
  {
    GgufBuilder b;
    b.Str("tokenizer.ggml.model", "gpt2").StrArray("tokenizer.ggml.tokens", {"a", "b"});
    expect_invalid(b, "tokenizer.ggml.merges is missing");
  }
  {
    GgufBuilder b;
    b.Str("tokenizer.ggml.model", "llama");
    expect_invalid(b, "tokenizer.ggml.tokens is missing");
  }
  {
    GgufBuilder b;
    b.Str("tokenizer.ggml.model", "llama").StrArray("tokenizer.ggml.tokens", {"a", "b", "c"});
    b.Array<float>("tokenizer.ggml.scores", GgufValueType::kFloat32, {0.f, 1.f});
    expect_invalid(b, "tokenizer.ggml.scores has 2 entries but there are 3 tokens");
  }
  {
    GgufBuilder b;
    b.Str("tokenizer.ggml.model", "llama").StrArray("tokenizer.ggml.tokens", {"a", "b", "c"});
    b.Array<int32_t>("tokenizer.ggml.token_type", GgufValueType::kInt32, {1, 1, 1, 1});
    expect_invalid(b, "tokenizer.ggml.token_type has 4 entries but there are 3 tokens");
  }
  {
    GgufBuilder b;
    b.Str("tokenizer.ggml.model", "llama").StrArray("tokenizer.ggml.tokens", {"a", "b", "a"});
    expect_invalid(b, "duplicate token");
  }
  {
    GgufBuilder b;
    b.Str("tokenizer.ggml.model", "llama")
        .Array<int32_t>("tokenizer.ggml.tokens", GgufValueType::kInt32, {1, 2, 3});
    expect_invalid(b, "tokenizer.ggml.tokens");
  }
  expect_invalid(BpeVocab().U32("tokenizer.ggml.bos_token_id", 10),
                 "tokenizer.ggml.bos_token_id = 10 is out of range");
  expect_invalid(BpeVocab().U32("tokenizer.ggml.eot_token_id", 1000), "out of range");
  expect_invalid(BpeVocab().Bool("tokenizer.ggml.add_bos_token", true), "no BOS token");
  expect_invalid(BpeVocab().Str("tokenizer.ggml.bos_token_id", "1"), "bos_token_id");
}

// ---------------------------------------------------------------------------------------------
// Speed: 1 MiB of English-like text.

std::string EnglishMegabyte() {
  const std::vector<std::string> words = {
      "the",   "of",      "and",    "to",         "in",        "is",         "was",
      "that",  "for",     "it",     "with",       "as",        "his",        "on",
      "be",    "at",      "by",     "I",          "this",      "had",        "not",
      "are",   "but",     "from",   "or",         "have",      "an",         "they",
      "which", "one",     "you",    "were",       "her",       "all",        "she",
      "there", "would",   "their",  "we",         "him",       "tokenizer",  "language",
      "model", "serving", "engine", "throughput", "latency",   "cache",      "2024",
      "1,000", "3.14",    "don't",  "it's",       "(example)", "\"quoted\"", "well-known"};
  std::string text;
  uint32_t x = 12345;
  int in_sentence = 0;
  while (text.size() < (1u << 20)) {
    x = x * 1103515245u + 12345u;
    std::string w = words[(x >> 16) % words.size()];
    if (in_sentence == 0 && !w.empty()) w[0] = static_cast<char>(std::toupper(w[0]));
    text += w;
    if (++in_sentence > 8 + (x >> 28)) {
      text += (x >> 8) % 7 == 0 ? ".\n\n" : ". ";
      in_sentence = 0;
    } else {
      text += (x >> 12) % 11 == 0 ? ", " : " ";
    }
  }
  return text;
}

TEST_P(VocabTest, EncodesAMegabyteQuickly) {
  const Tokenizer& tok = Load(GetParam());
  static const std::string text = EnglishMegabyte();
  const auto start = std::chrono::steady_clock::now();
  const std::vector<int32_t> ids = tok.Encode(text, false, false);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("[ speed    ] %-15s %.2f MiB -> %zu tokens in %.3f s\n", GetParam().c_str(),
              text.size() / 1048576.0, ids.size(), s);
  if (RoundTrips(tok)) {
    EXPECT_EQ(tok.Decode(ids), text);
  }
  EXPECT_LT(s, 2.0) << "far slower than expected (O(n^2) somewhere?)";
}

std::string ParamName(const ::testing::TestParamInfo<std::string>& info) {
  std::string s = info.param;
  for (char& c : s) {
    if (c == '-' || c == '.') c = '_';
  }
  return s;
}

INSTANTIATE_TEST_SUITE_P(TestVectors, VectorTest, ::testing::ValuesIn(kVocabs), ParamName);
INSTANTIATE_TEST_SUITE_P(AllVocabs, VocabTest, ::testing::ValuesIn(kAllVocabs), ParamName);

}  // namespace
}  // namespace pd::engine
