// ReadHfTokenizer: small hand-written tokenizer.json folders of each supported kind give the GGUF
// vocabulary llama.cpp's converter would write; malformed and unsupported ones give the right
// status and a message naming the file and the JSON path; and a round trip (SetVocabKeys -> GGUF
// -> Tokenizer::FromGguf) encodes as Hugging Face's tokenizers would.
#include "engine/tokenizer/hf_tokenizer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "common/status.h"
#include "common/status_matchers.h"
#include "engine/model/gguf.h"
#include "engine/quant/quantize/gguf_vocab.h"
#include "engine/quant/quantize/gguf_writer.h"
#include "engine/tokenizer/tokenizer.h"
#include "engine/tokenizer/unicode.h"
#include "nlohmann/json.hpp"

namespace pd::engine {
namespace {

using json = nlohmann::json;
using ::pd::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr int32_t kNormal = 1, kControl = 3, kUserDefined = 4, kUnused = 5, kByte = 6;
const std::string kSp = "\xE2\x96\x81";  // U+2581

const char* kLlama3Regex = R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3})"
                           R"(| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char* kQwen2Regex = R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N})"
                          R"(| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

json ByteLevel(bool use_regex) {
  return {{"type", "ByteLevel"},
          {"add_prefix_space", false},
          {"trim_offsets", true},
          {"use_regex", use_regex}};
}
json Split(const std::string& regex) {
  return {{"type", "Split"},
          {"pattern", {{"Regex", regex}}},
          {"behavior", "Isolated"},
          {"invert", false}};
}
json Sequence(std::vector<json> steps) { return {{"type", "Sequence"}, {"pretokenizers", steps}}; }
json Added(int id, const std::string& content, bool special) {
  return {{"id", id},        {"content", content},     {"single_word", false}, {"lstrip", false},
          {"rstrip", false}, {"normalized", !special}, {"special", special}};
}

// A byte-level BPE: the 256 byte symbols (id = byte), then "hello", "Ġworld" and friends from
// merges, then <|endoftext|> as an added special token.
json ByteLevelTokenizer(json pre_tokenizer) {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) {
    vocab[tokenizer_internal::ByteToUnicodeUtf8(static_cast<uint8_t>(b))] = b;
  }
  const std::vector<std::pair<std::string, std::string>> merges = {
      {"h", "e"}, {"l", "l"},   {"he", "ll"},  {"hell", "o"},  {"Ġ", "w"},
      {"o", "r"}, {"Ġw", "or"}, {"Ġwor", "l"}, {"Ġworl", "d"}, {"1", "2"}};
  json merge_list = json::array();
  int id = 256;
  for (const auto& [l, r] : merges) {
    vocab[l + r] = id++;
    merge_list.push_back(l + " " + r);
  }
  vocab["<|endoftext|>"] = id;  // 266
  return {{"version", "1.0"},
          {"added_tokens", {Added(266, "<|endoftext|>", true)}},
          {"normalizer", nullptr},
          {"pre_tokenizer", pre_tokenizer},
          {"post_processor", ByteLevel(true)},
          {"decoder", ByteLevel(true)},
          {"model",
           {{"type", "BPE"},
            {"dropout", nullptr},
            {"unk_token", nullptr},
            {"continuing_subword_prefix", nullptr},
            {"end_of_word_suffix", nullptr},
            {"fuse_unk", false},
            {"byte_fallback", false},
            {"ignore_merges", false},
            {"vocab", vocab},
            {"merges", merge_list}}}};
}

// A SentencePiece-style BPE in the layout of Llama 2's tokenizer.json: <unk> <s> </s>, the 256 byte
// tokens, characters, then tokens with complete merges (every split into two tokens is a merge).
json SpmTokenizer() {
  json vocab = json::object();
  vocab["<unk>"] = 0;
  vocab["<s>"] = 1;
  vocab["</s>"] = 2;
  static constexpr char kHex[] = "0123456789ABCDEF";
  for (int b = 0; b < 256; ++b) {
    vocab[std::string{'<', '0', 'x', kHex[b >> 4], kHex[b & 15], '>'}] = 3 + b;
  }
  int id = 259;
  for (const std::string& c : std::vector<std::string>{kSp, "h", "e", "l", "o", "w", "r", "d"}) {
    vocab[c] = id++;
  }
  // "l l" ranks before "e l": "ell" is e + ll by rank, el + l left to right.
  const std::vector<std::pair<std::string, std::string>> merges = {
      {"l", "l"},          {"h", "e"},          {kSp, "he"}, {kSp + "he", "ll"},
      {kSp + "hell", "o"}, {"o", "r"},          {kSp, "w"},  {kSp + "w", "or"},
      {kSp + "wor", "l"},  {kSp + "worl", "d"}, {"e", "l"}};
  json merge_list = json::array();
  for (const auto& [l, r] : merges) {
    vocab[l + r] = id++;
    merge_list.push_back(json::array({l, r}));
  }
  return {
      {"version", "1.0"},
      {"added_tokens", {Added(0, "<unk>", true), Added(1, "<s>", true), Added(2, "</s>", true)}},
      {"normalizer",
       {{"type", "Sequence"},
        {"normalizers",
         {{{"type", "Prepend"}, {"prepend", kSp}},
          {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", kSp}}}}}},
      {"pre_tokenizer", nullptr},
      {"post_processor",
       {{"type", "TemplateProcessing"},
        {"single",
         {{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
          {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
        {"pair",
         {{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
          {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
          {{"SpecialToken", {{"id", "<s>"}, {"type_id", 1}}}},
          {{"Sequence", {{"id", "B"}, {"type_id", 1}}}}}}}},
      {"decoder",
       {{"type", "Sequence"},
        {"decoders",
         {{{"type", "Replace"}, {"pattern", {{"String", kSp}}}, {"content", " "}},
          {{"type", "ByteFallback"}},
          {{"type", "Fuse"}},
          {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}}}}},
      {"model",
       {{"type", "BPE"},
        {"dropout", nullptr},
        {"unk_token", "<unk>"},
        {"fuse_unk", true},
        {"byte_fallback", true},
        {"ignore_merges", false},
        {"vocab", vocab},
        {"merges", merge_list}}}};
}

class HfTokenizerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = ::testing::TempDir() + "/hf_tokenizer_XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  void Write(const std::string& name, const std::string& text) {
    std::ofstream(dir_ + "/" + name, std::ios::binary) << text;
  }
  void Write(const std::string& name, const json& j) { Write(name, j.dump(1)); }
  absl::StatusOr<GgufVocab> Read() { return ReadHfTokenizer(dir_); }

  // SetVocabKeys -> a GGUF file -> Tokenizer::FromGguf.
  std::unique_ptr<Tokenizer> Load(const GgufVocab& v) {
    quantize::GgufWriter w;
    quantize::SetVocabKeys(v, &w);
    const std::string path = dir_ + "/vocab.gguf";
    PD_CHECK_OK(w.Open(path));
    PD_CHECK_OK(w.Commit());
    absl::StatusOr<std::unique_ptr<GgufFile>> gguf = GgufFile::Open(path);
    PD_CHECK_OK(gguf.status());
    absl::StatusOr<std::unique_ptr<Tokenizer>> tok = Tokenizer::FromGguf(**gguf);
    PD_CHECK_OK(tok.status());
    return std::move(*tok);
  }

  std::string dir_;
};

int32_t IdOf(const GgufVocab& v, const std::string& text) {
  for (size_t i = 0; i < v.tokens.size(); ++i) {
    if (v.tokens[i] == text) return static_cast<int32_t>(i);
  }
  ADD_FAILURE() << "no token " << text;
  return -1;
}

// ---- byte-level BPE ---------------------------------------------------------------------------

TEST_F(HfTokenizerTest, Gpt2ByteLevel) {
  Write("tokenizer.json", ByteLevelTokenizer(ByteLevel(true)));
  Write("tokenizer_config.json",
        json{{"bos_token", "<|endoftext|>"},
             {"eos_token", "<|endoftext|>"},
             {"unk_token", "<|endoftext|>"},
             {"add_bos_token", true},  // the post_processor's false wins, as in SpecialVocab
             {"chat_template", "{{ messages }}"}});
  absl::StatusOr<GgufVocab> v = Read();
  PD_ASSERT_OK(v.status());
  EXPECT_EQ(v->model, "gpt2");
  EXPECT_EQ(v->pre, "gpt-2");
  ASSERT_EQ(v->tokens.size(), 267u);
  EXPECT_EQ(v->tokens[0], "\xC4\x80");  // byte 0 in GPT-2's alphabet
  EXPECT_EQ(v->tokens[259], "hello");
  EXPECT_EQ(v->tokens[266], "<|endoftext|>");
  EXPECT_TRUE(v->scores.empty());
  EXPECT_EQ(v->token_types[259], kNormal);
  EXPECT_EQ(v->token_types[266], kControl);
  ASSERT_EQ(v->merges.size(), 10u);
  EXPECT_EQ(v->merges[0], "h e");
  EXPECT_EQ(v->merges[4], "Ġ w");
  EXPECT_EQ(v->bos, 266);
  EXPECT_EQ(v->eos, 266);
  EXPECT_EQ(v->unk, 266);
  EXPECT_FALSE(v->pad.has_value());
  EXPECT_EQ(v->add_bos, false);
  EXPECT_EQ(v->add_eos, false);
  EXPECT_FALSE(v->add_space_prefix.has_value());
  EXPECT_EQ(v->chat_template, "{{ messages }}");

  std::unique_ptr<Tokenizer> tok = Load(*v);
  EXPECT_THAT(tok->Encode("hello world", true, true), ElementsAre(259, 264));
  EXPECT_THAT(tok->Encode("hi 12", true, true), ElementsAre('h', 'i', ' ', 265));
  EXPECT_THAT(tok->Encode("hello<|endoftext|>", true, true), ElementsAre(259, 266));
  EXPECT_EQ(tok->Decode(tok->Encode("hello world 12", true, true)), "hello world 12");
}

// The pre-tokenizer name comes from the definition, ignore_merges and clean_up_tokenization_spaces.
TEST_F(HfTokenizerTest, PreTokenizerChosenFromDefinition) {
  struct Case {
    json pre_tokenizer;
    bool ignore_merges;
    std::optional<bool> clean_spaces;
    std::string want;
  };
  const json digits = {{"type", "Digits"}, {"individual_digits", true}};
  const std::vector<Case> cases = {
      {ByteLevel(true), false, std::nullopt, "gpt-2"},
      {ByteLevel(true), false, false, "trillion"},
      {Sequence({Split(kLlama3Regex), ByteLevel(false)}), true, std::nullopt, "llama-bpe"},
      {Sequence({Split(kLlama3Regex), ByteLevel(false)}), false, std::nullopt, "smaug-bpe"},
      {Sequence({Split(kQwen2Regex), ByteLevel(false)}), false, std::nullopt, "qwen2"},
      {Sequence({Split(kQwen2Regex), ByteLevel(false)}), false, true, "stablelm2"},
      {Sequence({digits, ByteLevel(true)}), false, std::nullopt, "starcoder"},
      {Sequence({digits, ByteLevel(true)}), false, false, "smollm"},
      // DeepSeek V3's, with its line breaks written as characters (as its file has them).
      {Sequence({Split(R"(\p{N}{1,3})"), Split("[\u4E00-\u9FA5\u3040-\u309F\u30A0-\u30FF]+"),
                 Split("[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}"
                       "\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)"
                       "|\\s+"),
                 ByteLevel(false)}),
       false, std::nullopt, "deepseek-v3"},
  };
  for (const Case& c : cases) {
    json t = ByteLevelTokenizer(c.pre_tokenizer);
    t["model"]["ignore_merges"] = c.ignore_merges;
    Write("tokenizer.json", t);
    json config = json::object();
    if (c.clean_spaces.has_value()) config["clean_up_tokenization_spaces"] = *c.clean_spaces;
    Write("tokenizer_config.json", config);
    absl::StatusOr<GgufVocab> v = Read();
    PD_ASSERT_OK(v.status()) << c.pre_tokenizer.dump();
    EXPECT_EQ(v->pre, c.want) << c.pre_tokenizer.dump();
  }
}

TEST_F(HfTokenizerTest, Llama3RoundTripIgnoresMerges) {
  // With ignore_merges a piece that is a token is that token, even where no merge makes it.
  json t = ByteLevelTokenizer(Sequence({Split(kLlama3Regex), ByteLevel(false)}));
  t["model"]["ignore_merges"] = true;
  t["model"]["vocab"]["abc"] = 267;
  t["added_tokens"].push_back(Added(268, "<|begin_of_text|>", true));
  t["post_processor"] = {{"type", "Sequence"},
                         {"processors",
                          {ByteLevel(false),
                           {{"type", "TemplateProcessing"},
                            {"single",
                             {{{"SpecialToken", {{"id", "<|begin_of_text|>"}, {"type_id", 0}}}},
                              {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
                            {"pair", json::array()},
                            {"special_tokens", json::object()}}}}};
  Write("tokenizer.json", t);
  Write("tokenizer_config.json",
        json{{"bos_token", "<|begin_of_text|>"}, {"eos_token", "<|endoftext|>"}});
  absl::StatusOr<GgufVocab> v = Read();
  PD_ASSERT_OK(v.status());
  EXPECT_EQ(v->pre, "llama-bpe");
  EXPECT_EQ(v->bos, 268);
  EXPECT_EQ(v->eos, 266);
  EXPECT_EQ(v->add_bos, true);
  EXPECT_EQ(v->add_eos, false);  // ByteLevel's: the template does not end with a special token
  std::unique_ptr<Tokenizer> tok = Load(*v);
  EXPECT_THAT(tok->Encode("abc hello", true, true), ElementsAre(268, 267, ' ', 259));
}

// ---- SentencePiece-style BPE ------------------------------------------------------------------

TEST_F(HfTokenizerTest, SentencePieceStyle) {
  Write("tokenizer.json", SpmTokenizer());
  Write("tokenizer_config.json", json{{"bos_token", {{"content", "<s>"}, {"lstrip", false}}},
                                      {"eos_token", "</s>"},
                                      {"unk_token", "<unk>"},
                                      {"add_bos_token", true},
                                      {"add_eos_token", false}});
  absl::StatusOr<GgufVocab> v = Read();
  PD_ASSERT_OK(v.status());
  EXPECT_EQ(v->model, "llama");
  EXPECT_EQ(v->pre, "default");
  EXPECT_EQ(v->add_space_prefix, true);
  EXPECT_TRUE(v->merges.empty());
  ASSERT_EQ(v->tokens.size(), 278u);
  EXPECT_EQ(v->token_types[0], kControl);
  EXPECT_EQ(v->token_types[1], kControl);
  EXPECT_EQ(v->token_types[3], kByte);
  EXPECT_EQ(v->token_types[3 + 255], kByte);
  EXPECT_EQ(v->token_types[259], kNormal);
  // Scores: minus the rank of the merge that makes the token; the rest below every one.
  ASSERT_EQ(v->scores.size(), v->tokens.size());
  EXPECT_EQ(v->scores[IdOf(*v, "ll")], 0.0f);
  EXPECT_EQ(v->scores[IdOf(*v, "he")], -1.0f);
  EXPECT_EQ(v->scores[IdOf(*v, "el")], -10.0f);
  EXPECT_EQ(v->scores[IdOf(*v, "h")], -12.0f);
  EXPECT_EQ(v->bos, 1);
  EXPECT_EQ(v->eos, 2);
  EXPECT_EQ(v->unk, 0);
  EXPECT_EQ(v->add_bos, true);
  EXPECT_EQ(v->add_eos, false);

  std::unique_ptr<Tokenizer> tok = Load(*v);
  const int32_t sp = IdOf(*v, kSp);
  EXPECT_THAT(tok->Encode("hello world", true, true),
              ElementsAre(1, IdOf(*v, kSp + "hello"), IdOf(*v, kSp + "world")));
  // By rank, as Hugging Face: e + ll (left to right with equal scores it would be el + l).
  EXPECT_THAT(tok->Encode("ell", false, false), ElementsAre(sp, IdOf(*v, "e"), IdOf(*v, "ll")));
  // Byte fallback for characters outside the vocabulary.
  EXPECT_THAT(tok->Encode("hi", false, false), ElementsAre(sp, IdOf(*v, "h"), 3 + 'i'));
  EXPECT_EQ(tok->Decode(tok->Encode("hello world hi", false, false)), "hello world hi");
}

TEST_F(HfTokenizerTest, MetaspacePrependScheme) {
  const std::vector<std::pair<std::string, bool>> schemes = {
      {"first", true}, {"always", true}, {"never", false}};
  for (const auto& [scheme, prefix] : schemes) {
    json t = SpmTokenizer();
    t["normalizer"] = nullptr;
    t["pre_tokenizer"] = {
        {"type", "Metaspace"}, {"replacement", kSp}, {"prepend_scheme", scheme}, {"split", false}};
    Write("tokenizer.json", t);
    absl::StatusOr<GgufVocab> v = Read();
    PD_ASSERT_OK(v.status()) << scheme;
    EXPECT_EQ(v->add_space_prefix, prefix) << scheme;
    EXPECT_FALSE(v->bos.has_value()) << "no tokenizer_config.json: no ids";
    EXPECT_EQ(v->add_bos, true) << "from the TemplateProcessing";
  }
  // Replace without Prepend: no prefix (Gemma).
  json t = SpmTokenizer();
  t["normalizer"] = {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", kSp}};
  Write("tokenizer.json", t);
  absl::StatusOr<GgufVocab> v = Read();
  PD_ASSERT_OK(v.status());
  EXPECT_EQ(v->add_space_prefix, false);
}

// ---- added tokens, padding, special tokens, chat templates ------------------------------------

TEST_F(HfTokenizerTest, AddedTokensAndPadding) {
  json t = ByteLevelTokenizer(ByteLevel(true));
  t["added_tokens"].push_back(Added(267, "<|im_start|>", false));       // looks special
  t["added_tokens"].push_back(Added(268, "my" + kSp + "word", false));  // user-defined
  t["added_tokens"].push_back(Added(269, "[INST]", true));
  Write("tokenizer.json", t);
  Write("config.json", json{{"vocab_size", 272}, {"eos_token_id", 266}, {"pad_token_id", 9999}});
  absl::StatusOr<GgufVocab> v = Read();
  PD_ASSERT_OK(v.status());
  ASSERT_EQ(v->tokens.size(), 272u);
  EXPECT_EQ(v->token_types[267], kControl);
  EXPECT_EQ(v->tokens[268], "my word");
  EXPECT_EQ(v->token_types[268], kUserDefined);
  EXPECT_EQ(v->token_types[269], kControl);
  EXPECT_EQ(v->tokens[270], "[PAD270]");
  EXPECT_EQ(v->token_types[270], kUnused);
  EXPECT_EQ(v->tokens[271], "[PAD271]");
  EXPECT_EQ(v->eos, 266);            // from config.json
  EXPECT_FALSE(v->pad.has_value());  // out of range: skipped
  std::unique_ptr<Tokenizer> tok = Load(*v);
  EXPECT_THAT(tok->Encode("hellomy word", false, false), ElementsAre(259, 268));
}

// An added token whose text model.vocab has under another id takes the text; llama.cpp's
// converter (get_vocab_base) then writes that id as an unused [PADn].
TEST_F(HfTokenizerTest, AddedTokenTakesTextOfModelToken) {
  json t = ByteLevelTokenizer(ByteLevel(true));
  t["added_tokens"][0]["id"] = 267;  // "<|endoftext|>" is 266 in model.vocab
  t["model"]["vocab"]["x1"] = 268;   // (a real token, so that there is an id 267 to fill)
  Write("tokenizer.json", t);
  Write("config.json", json{{"vocab_size", 269}});
  absl::StatusOr<GgufVocab> v = Read();
  PD_ASSERT_OK(v.status());
  EXPECT_EQ(v->tokens[266], "[PAD266]");
  EXPECT_EQ(v->token_types[266], kUnused);
  EXPECT_EQ(v->tokens[267], "<|endoftext|>");
  EXPECT_EQ(v->token_types[267], kControl);
}

TEST_F(HfTokenizerTest, UserDefinedSpacesMayNotCollide) {
  json t = ByteLevelTokenizer(ByteLevel(true));
  t["model"]["vocab"]["a b"] = 267;
  t["added_tokens"].push_back(Added(268, "a" + kSp + "b", false));
  Write("tokenizer.json", t);
  EXPECT_THAT(Read(),
              StatusIs(absl::StatusCode::kInvalidArgument, "tokens 267 and 268 are both \"a b\""));
}

TEST_F(HfTokenizerTest, TemplateLastTokenBecomesEosAndOldEosEot) {
  json t = SpmTokenizer();
  t["added_tokens"].push_back(Added(278, "<eot>", true));
  t["post_processor"]["single"].push_back({{"SpecialToken", {{"id", "<eot>"}, {"type_id", 0}}}});
  Write("tokenizer.json", t);
  Write("tokenizer_config.json", json{{"bos_token", "<s>"}, {"eos_token", "</s>"}});
  absl::StatusOr<GgufVocab> v = Read();
  PD_ASSERT_OK(v.status());
  EXPECT_EQ(v->eos, 278);
  EXPECT_EQ(v->eot, 2);
  EXPECT_EQ(v->add_bos, true);
  EXPECT_EQ(v->add_eos, true);
}

TEST_F(HfTokenizerTest, ChatTemplates) {
  Write("tokenizer.json", ByteLevelTokenizer(ByteLevel(true)));
  Write("tokenizer_config.json", json{{"chat_template",
                                       {{{"name", "default"}, {"template", "D"}},
                                        {{"name", "tool-use"}, {"template", "T"}}}}});
  absl::StatusOr<GgufVocab> v = Read();
  PD_ASSERT_OK(v.status());
  EXPECT_EQ(v->chat_template, "D");
  ASSERT_EQ(v->named_chat_templates.size(), 1u);
  EXPECT_EQ(v->named_chat_templates[0].first, "tool_use");
  EXPECT_EQ(v->named_chat_templates[0].second, "T");

  // chat_template.jinja when tokenizer_config.json has none.
  Write("tokenizer_config.json", json{{"eos_token", "<|endoftext|>"}});
  Write("chat_template.jinja", std::string("J"));
  v = Read();
  PD_ASSERT_OK(v.status());
  EXPECT_EQ(v->chat_template, "J");
  EXPECT_EQ(v->eos, 266);
}

TEST_F(HfTokenizerTest, VocabKeysAreLlamaCppNames) {
  GgufVocab v;
  v.model = "gpt2";
  v.pre = "qwen2";
  v.tokens = {"a", "b", "ab"};
  v.token_types = {1, 1, 3};
  v.merges = {"a b"};
  v.bos = 2;
  v.sep = 1;
  v.add_bos = false;
  v.chat_template = "x";
  v.named_chat_templates = {{"rag", "y"}};
  quantize::GgufWriter w;
  quantize::SetVocabKeys(v, &w);
  const std::string path = dir_ + "/keys.gguf";
  PD_ASSERT_OK(w.Open(path));
  PD_ASSERT_OK(w.Commit());
  absl::StatusOr<std::unique_ptr<GgufFile>> g = GgufFile::Open(path);
  PD_ASSERT_OK(g.status());
  std::vector<std::string> keys;
  for (const auto& [key, value] : (*g)->metadata()) keys.push_back(key);
  EXPECT_THAT(keys, ::testing::UnorderedElementsAre(
                        "tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.tokens",
                        "tokenizer.ggml.token_type", "tokenizer.ggml.merges",
                        "tokenizer.ggml.bos_token_id", "tokenizer.ggml.seperator_token_id",
                        "tokenizer.ggml.add_bos_token", "tokenizer.chat_template",
                        "tokenizer.chat_template.rag", "tokenizer.chat_templates"));
  EXPECT_EQ((*g)->Find("tokenizer.ggml.token_type")->elem_type, GgufValueType::kInt32);
  EXPECT_EQ((*g)->Find("tokenizer.ggml.bos_token_id")->type, GgufValueType::kUint32);
  EXPECT_EQ((*g)->Find("tokenizer.ggml.add_bos_token")->type, GgufValueType::kBool);
}

// ---- errors -----------------------------------------------------------------------------------

TEST_F(HfTokenizerTest, MissingFile) {
  EXPECT_THAT(Read(), StatusIs(absl::StatusCode::kNotFound, "tokenizer.json"));
}

TEST_F(HfTokenizerTest, BadJson) {
  Write("tokenizer.json", std::string("{\n  \"model\": {,\n}"));
  absl::StatusOr<GgufVocab> v = Read();
  EXPECT_THAT(v, StatusIs(absl::StatusCode::kInvalidArgument, "tokenizer.json: not valid JSON"));
  EXPECT_THAT(std::string(v.status().message()), HasSubstr("line 2"));

  Write("tokenizer.json", ByteLevelTokenizer(ByteLevel(true)));
  Write("tokenizer_config.json", std::string("[1, 2"));
  EXPECT_THAT(Read(), StatusIs(absl::StatusCode::kInvalidArgument, "tokenizer_config.json"));
}

struct ErrorCase {
  std::string what;
  std::function<void(json*)> edit;
  absl::StatusCode code;
  std::string message;
};

TEST_F(HfTokenizerTest, MalformedOrUnsupportedByteLevel) {
  const std::vector<ErrorCase> cases = {
      {"no model", [](json* t) { t->erase("model"); }, absl::StatusCode::kInvalidArgument,
       "tokenizer.json: \"model\" is missing"},
      {"vocab not an object", [](json* t) { (*t)["model"]["vocab"] = json::array(); },
       absl::StatusCode::kInvalidArgument,
       "model.vocab: expected an object (token -> id), got an array"},
      {"id not an integer", [](json* t) { (*t)["model"]["vocab"]["he"] = "x"; },
       absl::StatusCode::kInvalidArgument,
       "model.vocab[\"he\"]: expected a token id (an integer), got a string"},
      {"negative id", [](json* t) { (*t)["model"]["vocab"]["he"] = -1; },
       absl::StatusCode::kInvalidArgument, "model.vocab[\"he\"]: token id -1 is out of range"},
      {"duplicate id", [](json* t) { (*t)["model"]["vocab"]["he"] = 257; },
       absl::StatusCode::kInvalidArgument, "is also the id of"},
      {"id out of range", [](json* t) { (*t)["model"]["vocab"]["he"] = 5000; },
       absl::StatusCode::kInvalidArgument, "model.vocab[\"he\"]: id 5000 is out of range"},
      {"added id out of range", [](json* t) { (*t)["added_tokens"][0]["id"] = 300; },
       absl::StatusCode::kInvalidArgument, "added_tokens[0].id: id 300 is out of range"},
      {"added id clash", [](json* t) { (*t)["added_tokens"][0]["id"] = 5; },
       absl::StatusCode::kInvalidArgument, "added_tokens[0]: id 5 is \"<|endoftext|>\" here"},
      {"merge of unknown token", [](json* t) { (*t)["model"]["merges"][1] = "l zz"; },
       absl::StatusCode::kInvalidArgument, "model.merges[1]: \"zz\" is not in model.vocab"},
      {"merged token missing", [](json* t) { (*t)["model"]["merges"][1] = "l o"; },
       absl::StatusCode::kInvalidArgument, "model.merges[1]: the merged token \"lo\" is not in"},
      {"merge without space", [](json* t) { (*t)["model"]["merges"][1] = "ll"; },
       absl::StatusCode::kInvalidArgument, "model.merges[1]: expected \"left right\""},
      {"merges not an array", [](json* t) { (*t)["model"]["merges"] = 3; },
       absl::StatusCode::kInvalidArgument, "model.merges: expected an array, got an integer"},
      {"byte_fallback not a bool", [](json* t) { (*t)["model"]["byte_fallback"] = "yes"; },
       absl::StatusCode::kInvalidArgument, "model.byte_fallback: expected a boolean"},
      {"unknown pre-tokenizer",
       [](json* t) {
         (*t)["pre_tokenizer"] = Sequence({Split("[a-z]+"), ByteLevel(false)});
       },
       absl::StatusCode::kUnimplemented, "unknown pre-tokenizer: splits by \"[a-z]+\""},
      {"Llama 3 regex without ByteLevel",
       [](json* t) { (*t)["pre_tokenizer"] = Split(kLlama3Regex); },
       absl::StatusCode::kUnimplemented, "needs a ByteLevel pre-tokenizer"},
      {"Whitespace pre-tokenizer",
       [](json* t) {
         (*t)["pre_tokenizer"] = {{"type", "Whitespace"}};
       },
       absl::StatusCode::kUnimplemented,
       "pre_tokenizer: pre-tokenizer \"Whitespace\" is not supported"},
      {"ByteLevel add_prefix_space",
       [](json* t) { (*t)["pre_tokenizer"]["add_prefix_space"] = true; },
       absl::StatusCode::kUnimplemented, "ByteLevel with add_prefix_space"},
      {"Lowercase normalizer",
       [](json* t) {
         (*t)["normalizer"] = {{"type", "Lowercase"}};
       },
       absl::StatusCode::kUnimplemented, "normalizer: normalizer \"Lowercase\" is not supported"},
      {"Qwen 2 with ignore_merges",
       [](json* t) {
         (*t)["pre_tokenizer"] = Sequence({Split(kQwen2Regex), ByteLevel(false)});
         (*t)["model"]["ignore_merges"] = true;
       },
       absl::StatusCode::kUnimplemented, "Qwen 2's, but with ignore_merges true"},
      {"Unigram", [](json* t) { (*t)["model"]["type"] = "Unigram"; },
       absl::StatusCode::kInvalidArgument,
       "model.vocab: expected an array of [piece, score] pairs, got an object"},
      {"WordPiece", [](json* t) { (*t)["model"]["type"] = "WordPiece"; },
       absl::StatusCode::kUnimplemented, "\"WordPiece\" tokenizers are not supported"},
      {"dropout", [](json* t) { (*t)["model"]["dropout"] = 0.1; }, absl::StatusCode::kUnimplemented,
       "model.dropout"},
      {"no decoder", [](json* t) { t->erase("decoder"); }, absl::StatusCode::kUnimplemented,
       "decoder: a byte-level BPE needs a ByteLevel decoder"},
  };
  for (const ErrorCase& c : cases) {
    json t = ByteLevelTokenizer(ByteLevel(true));
    c.edit(&t);
    Write("tokenizer.json", t);
    EXPECT_THAT(Read(), StatusIs(c.code, c.message)) << c.what;
  }
}

TEST_F(HfTokenizerTest, MalformedOrUnsupportedSentencePiece) {
  const std::vector<ErrorCase> cases = {
      {"incomplete merges", [](json* t) { (*t)["model"]["merges"].erase(2); },
       absl::StatusCode::kUnimplemented,
       "token \"" + kSp + "he\" (id 269) is \"" + kSp +
           "\" + \"he\", both tokens, but that is not a merge"},
      {"no U+2581", [](json* t) { (*t)["normalizer"] = nullptr; }, absl::StatusCode::kUnimplemented,
       "needs spaces made U+2581"},
      {"NFKC",
       [](json* t) {
         (*t)["normalizer"]["normalizers"].push_back({{"type", "NFKC"}});
       },
       absl::StatusCode::kUnimplemented, "normalizer \"NFKC\" is not supported"},
      {"no ByteFallback decoder",
       [](json* t) {
         (*t)["decoder"] = {{"type", "Fuse"}};
       },
       absl::StatusCode::kUnimplemented, "needs a ByteFallback decoder"},
      {"Metaspace split with an inner U+2581",
       [](json* t) {
         (*t)["normalizer"] = nullptr;
         (*t)["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", kSp}, {"split", true}};
         (*t)["model"]["vocab"]["x" + kSp + "y"] = 278;
       },
       absl::StatusCode::kUnimplemented, "Metaspace split with token \"x" + kSp + "y\""},
  };
  for (const ErrorCase& c : cases) {
    json t = SpmTokenizer();
    c.edit(&t);
    Write("tokenizer.json", t);
    EXPECT_THAT(Read(), StatusIs(c.code, c.message)) << c.what;
  }
}

// ---- Unigram -----------------------------------------------------------------------------------

// A charsmap of one key, TAB -> " " (three 256-unit blocks, as darts-clone writes them), base64.
std::string TabCharsmapBase64() {
  std::vector<uint32_t> u(768, 0);
  u[0] = 256u << 10;
  u[256 ^ 9] = ((265u ^ 512u) << 10) | (1u << 8) | 9;
  u[512] = 0x80000000u;
  std::string blob;
  auto put = [&](uint32_t x) {
    for (int i = 0; i < 4; ++i) blob.push_back(static_cast<char>(x >> (8 * i)));
  };
  put(static_cast<uint32_t>(u.size() * 4));
  for (uint32_t x : u) put(x);
  blob += std::string(" \0", 2);
  return absl::Base64Escape(blob);
}

// T5's layout: <pad> </s> <unk>, pieces with log probabilities, transformers' SentencePiece
// normalizer (Precompiled, Strip, Replace) and Metaspace, a post-processor that adds </s>.
json UnigramTokenizer() {
  json vocab = json::array({json::array({"<pad>", 0.0}), json::array({"</s>", 0.0}),
                            json::array({"<unk>", 0.0}), json::array({kSp, -2.0}),
                            json::array({"a", -3.0}), json::array({"b", -3.0}),
                            json::array({kSp + "a", -3.5}), json::array({"<0x41>", 0.0})});
  return {
      {"added_tokens", {Added(0, "<pad>", true), Added(1, "</s>", true), Added(2, "<unk>", true)}},
      {"normalizer",
       {{"type", "Sequence"},
        {"normalizers",
         {{{"type", "Precompiled"}, {"precompiled_charsmap", TabCharsmapBase64()}},
          {{"type", "Strip"}, {"strip_left", false}, {"strip_right", true}},
          {{"type", "Replace"}, {"pattern", {{"Regex", " {2,}"}}}, {"content", kSp}}}}}},
      {"pre_tokenizer",
       {{"type", "Metaspace"},
        {"replacement", kSp},
        {"prepend_scheme", "always"},
        {"split", true}}},
      {"post_processor",
       {{"type", "TemplateProcessing"},
        {"single",
         {{{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
          {{"SpecialToken", {{"id", "</s>"}, {"type_id", 0}}}}}},
        {"pair", json::array()},
        {"special_tokens", {{"</s>", {{"id", "</s>"}, {"ids", {1}}, {"tokens", {"</s>"}}}}}}}},
      {"decoder", {{"type", "Metaspace"}, {"replacement", kSp}, {"prepend_scheme", "always"}}},
      {"model", {{"type", "Unigram"}, {"unk_id", 2}, {"byte_fallback", true}, {"vocab", vocab}}}};
}

TEST_F(HfTokenizerTest, Unigram) {
  Write("tokenizer.json", UnigramTokenizer());
  Write("tokenizer_config.json",
        json{{"eos_token", "</s>"}, {"unk_token", "<unk>"}, {"pad_token", "<pad>"}});
  absl::StatusOr<GgufVocab> v = Read();
  PD_ASSERT_OK(v);
  EXPECT_EQ(v->model, "t5");
  EXPECT_EQ(v->pre, "");
  EXPECT_THAT(v->scores, ElementsAre(0, 0, 0, -2, -3, -3, -3.5f, 0));
  EXPECT_THAT(v->token_types,
              ElementsAre(kControl, kControl, 2, kNormal, kNormal, kNormal, kNormal, kByte));
  EXPECT_EQ(v->unk, 2);
  EXPECT_EQ(v->eos, 1);
  EXPECT_EQ(v->pad, 0);
  EXPECT_EQ(v->add_eos, true);
  EXPECT_EQ(v->add_bos, false);
  EXPECT_EQ(v->add_space_prefix, true);
  EXPECT_EQ(v->remove_extra_whitespaces, true);
  EXPECT_EQ(v->precompiled_charsmap.size(), 4u + 768 * 4 + 2);
  std::unique_ptr<Tokenizer> tok = Load(*v);
  EXPECT_EQ(tok->model(), TokenizerModel::kUgm);
  // TAB is a space (charsmap), runs of spaces one U+2581 (remove_extra_whitespaces).
  EXPECT_THAT(tok->Encode("a\t  b ", true, false), ElementsAre(6, 3, 5, 1));
  // "A" has only its byte token.
  EXPECT_THAT(tok->Encode("aA", false, false), ElementsAre(6, 7));
  EXPECT_EQ(tok->Decode({6, 3, 5, 7, 1}), "a bA");
}

TEST_F(HfTokenizerTest, MalformedOrUnsupportedUnigram) {
  const std::vector<ErrorCase> cases = {
      {"NFKC",
       [](json* t) {
         (*t)["normalizer"]["normalizers"].push_back({{"type", "NFKC"}});
       },
       absl::StatusCode::kUnimplemented,
       "normalizer.normalizers[3]: normalizer \"NFKC\" is not supported for a Unigram model"},
      {"no unk_id", [](json* t) { (*t)["model"].erase("unk_id"); },
       absl::StatusCode::kUnimplemented, "model.unk_id: a Unigram model without an unknown token"},
      {"vocab not pairs", [](json* t) { (*t)["model"]["vocab"][1] = "x"; },
       absl::StatusCode::kInvalidArgument, "model.vocab[1]: expected a [piece, score] pair"},
      {"bad charsmap",
       [](json* t) { (*t)["normalizer"]["normalizers"][0]["precompiled_charsmap"] = "AQAAAAA="; },
       absl::StatusCode::kInvalidArgument,
       "normalizer.normalizers[0].precompiled_charsmap: tokenizer.ggml.precompiled_charsmap: "
       "trie size 1 is not a multiple of 4"},
      {"Strip alone", [](json* t) { (*t)["normalizer"]["normalizers"].erase(2); },
       absl::StatusCode::kUnimplemented, "Strip without Replace"},
      {"no Metaspace", [](json* t) { (*t)["pre_tokenizer"] = nullptr; },
       absl::StatusCode::kUnimplemented, "a Unigram model needs a Metaspace pre-tokenizer"},
      {"WhitespaceSplit with first",
       [](json* t) {
         json meta = (*t)["pre_tokenizer"];
         meta["prepend_scheme"] = "first";
         (*t)["pre_tokenizer"] = {{"type", "Sequence"},
                                  {"pretokenizers", {{{"type", "WhitespaceSplit"}}, meta}}};
       },
       absl::StatusCode::kUnimplemented, "WhitespaceSplit with Metaspace prepend_scheme \"first\""},
      {"inner U+2581",
       [](json* t) {
         (*t)["model"]["vocab"].push_back({"x" + kSp, -1.0});
       },
       absl::StatusCode::kUnimplemented, "Metaspace split with token \"x" + kSp + "\""},
  };
  for (const ErrorCase& c : cases) {
    json t = UnigramTokenizer();
    c.edit(&t);
    Write("tokenizer.json", t);
    EXPECT_THAT(Read(), StatusIs(c.code, c.message)) << c.what;
  }
}

}  // namespace
}  // namespace pd::engine
