#include "tests/fuzz/fuzz_vocab.h"

#include <cstdio>
#include <memory>
#include <set>
#include <vector>

#include "common/mapped_file.h"
#include "common/status.h"
#include "engine/model/gguf.h"
#include "engine/tokenizer/unicode.h"
#include "tests/testing/gguf_builder.h"

namespace pd::fuzz {
namespace {

using engine::GgufValueType;
using engine::testing::GgufBuilder;

constexpr std::string_view kSpace = "\xE2\x96\x81";  // U+2581, SentencePiece's space

// The markers the chat templates write (engine/tokenizer/chat_template.cc), control tokens in
// every vocabulary, plus each model family's BOS / EOS.
// clang-format off
const std::vector<std::string>& ChatSpecials() {
  static const auto* v = new std::vector<std::string>{
      "<|begin_of_text|>", "<|end_of_text|>",     "<|start_header_id|>", "<|end_header_id|>",
      "<|eot_id|>",        "<|im_start|>",        "<|im_end|>",          "<start_of_turn>",
      "<end_of_turn>",     "<s>",                 "</s>"};
  return *v;
}

// Plain-text pieces the vocabularies merge into (SPM spells a leading space as U+2581; BPE takes
// the bytes into its byte-level alphabet).
const std::vector<std::string>& Words() {
  static const auto* v = new std::vector<std::string>{
      "the",  " the",  "he",    " a",    " and",  "and", "ing",    " in",   "in",
      "er",   "Hello", " world", "hello", " is",  "'s",  " 's",    "123",   "  ",
      "    ", "\n\n",  ".\n",    " (",    "),",   "\xC3\xA9",    " \xC3\xA9",
      "caf\xC3\xA9",   "\xC3\xBC" "ber",  "\xE6\x97\xA5\xE6\x9C\xAC",  // "日本"
      "\xE8\xAA\x9E",  // "語"
      "\xF0\x9F\x98\x80",  // U+1F600
      "\xC2\xAB",          // «
      "<|",   "|>",   "user", "assistant", "system", "model"};
  return *v;
}
// clang-format on

// SPM: <unk>, the chat specials, the 256 byte tokens, "▁", letters and digits (with and without
// "▁"), then Words() with spaces as "▁". Scores fall with the index, so earlier pieces merge first.
// kSpmNoPrefix adds the user-defined token and pieces with "▁" after a letter, which turn off the
// split at spaces (tokenizer.h's slower general path).
std::string SpmGguf(bool no_prefix) {
  std::vector<std::string> tokens = {"<unk>"};
  std::vector<int32_t> types = {2};
  auto add = [&](const std::string& t, int32_t type) {
    for (const std::string& have : tokens) {
      if (have == t) return;
    }
    tokens.push_back(t);
    types.push_back(type);
  };
  for (const std::string& s : ChatSpecials()) add(s, 3);
  if (no_prefix) add(std::string(kUserDefinedToken), 4);
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    add(name, 6);
  }
  const std::string sp(kSpace);
  add(sp, 1);
  add(sp + sp, 1);
  for (char c = 'a'; c <= 'z'; ++c) {
    add(std::string(1, c), 1);
    add(sp + c, 1);
  }
  for (char c = '0'; c <= '9'; ++c) add(std::string(1, c), 1);
  for (const std::string& w : Words()) {
    std::string escaped;
    for (char c : w) {
      if (c == ' ') {
        escaped += sp;
      } else {
        escaped.push_back(c);
      }
    }
    add(escaped, 1);
    add(sp + escaped, 1);
  }
  if (no_prefix) {
    add("e" + sp + "t", 1);
    add("a" + sp + "b", 1);
  }
  std::vector<float> scores(tokens.size());
  for (size_t i = 0; i < scores.size(); ++i) scores[i] = -static_cast<float>(i);
  GgufBuilder b;
  b.Str("general.architecture", "llama");
  b.Str("tokenizer.ggml.model", "llama");
  b.StrArray("tokenizer.ggml.tokens", tokens);
  b.Array<float>("tokenizer.ggml.scores", GgufValueType::kFloat32, scores);
  b.Array<int32_t>("tokenizer.ggml.token_type", GgufValueType::kInt32, types);
  b.U32("tokenizer.ggml.unknown_token_id", 0);
  b.U32("tokenizer.ggml.bos_token_id", 10);  // <s>
  b.U32("tokenizer.ggml.eos_token_id", 11);  // </s>
  if (no_prefix) b.Bool("tokenizer.ggml.add_space_prefix", false);
  return b.Build();
}

// BPE: the 256 byte-level characters (by byte value), then every prefix of each of Words() built
// left to right one byte-level character at a time (each step a merge), then the chat specials
// and the user-defined token.
std::string BpeGguf(std::string_view pre) {
  std::vector<std::string> tokens;
  std::vector<int32_t> types;
  std::set<std::string> have;
  auto add = [&](const std::string& t, int32_t type) {
    if (!have.insert(t).second) return;
    tokens.push_back(t);
    types.push_back(type);
  };
  for (int b = 0; b < 256; ++b) add(ByteLevel(std::string(1, static_cast<char>(b))), 1);
  std::vector<std::string> merges;
  std::set<std::string> have_merge;
  for (const std::string& w : Words()) {
    std::string left = ByteLevel(w.substr(0, 1));
    for (size_t i = 1; i < w.size(); ++i) {
      const std::string right = ByteLevel(w.substr(i, 1));
      const std::string merge = left + " " + right;
      if (have_merge.insert(merge).second) merges.push_back(merge);
      left += right;
      add(left, 1);
    }
  }
  const size_t first_special = tokens.size();
  for (const std::string& s : ChatSpecials()) add(s, 3);
  add(std::string(kUserDefinedToken), 4);
  GgufBuilder b;
  b.Str("general.architecture", "llama");
  b.Str("tokenizer.ggml.model", "gpt2");
  b.Str("tokenizer.ggml.pre", pre);
  b.StrArray("tokenizer.ggml.tokens", tokens);
  b.Array<int32_t>("tokenizer.ggml.token_type", GgufValueType::kInt32, types);
  b.StrArray("tokenizer.ggml.merges", merges);
  b.U32("tokenizer.ggml.bos_token_id", static_cast<uint32_t>(first_special));      // begin_of_text
  b.U32("tokenizer.ggml.eos_token_id", static_cast<uint32_t>(first_special + 1));  // end_of_text
  return b.Build();
}

std::unique_ptr<engine::Tokenizer> Load(FuzzVocab v) {
  const std::string bytes = VocabGguf(v);
  auto file = engine::GgufFile::Parse(MappedFile::Borrow(bytes.data(), bytes.size()));
  PD_CHECK_OK(file.status());
  auto tok = engine::Tokenizer::FromGguf(**file);
  PD_CHECK_OK(tok.status());
  return std::move(*tok);  // owns copies of what it needs: `bytes` may go
}

}  // namespace

std::string ByteLevel(std::string_view s) {
  std::string out;
  for (unsigned char c : s) out += engine::tokenizer_internal::ByteToUnicodeUtf8(c);
  return out;
}

std::string VocabGguf(FuzzVocab v) {
  switch (v) {
    case FuzzVocab::kSpm:
      return SpmGguf(/*no_prefix=*/false);
    case FuzzVocab::kSpmNoPrefix:
      return SpmGguf(/*no_prefix=*/true);
    case FuzzVocab::kBpeLlama3:
      return BpeGguf("llama3");
    case FuzzVocab::kBpeQwen2:
      return BpeGguf("qwen2");
  }
  PD_CHECK_MSG(false, "unknown FuzzVocab");
  return "";
}

const engine::Tokenizer& GetTokenizer(FuzzVocab v) {
  static std::unique_ptr<engine::Tokenizer>* cache = new std::unique_ptr<engine::Tokenizer>[4];
  std::unique_ptr<engine::Tokenizer>& t = cache[static_cast<int>(v)];
  if (t == nullptr) t = Load(v);
  return *t;
}

}  // namespace pd::fuzz
