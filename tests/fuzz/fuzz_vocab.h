// Small synthetic vocabularies for the fuzz harnesses, written as GGUF metadata in memory
// (tests/testing/gguf_builder.h) and loaded with Tokenizer::FromGguf, the way a model's are.
//
// Every vocabulary can spell every byte: the SPM ones have the 256 byte tokens <0x00>..<0xFF>
// (byte fallback), the BPE ones the 256 characters of GPT-2's byte-level alphabet. On top of
// those come a few hundred merged pieces (ASCII words, Latin-1, CJK, an emoji) and the special
// tokens of the chat templates (engine/tokenizer/chat_template.h), as control tokens.
#pragma once

#include <string>
#include <string_view>

#include "engine/tokenizer/tokenizer.h"

namespace pd::fuzz {

enum class FuzzVocab {
  kSpm,          // tokenizer.ggml.model = llama: space prefix, no user-defined tokens
  kSpmNoPrefix,  // llama, add_space_prefix = false, a user-defined token, pieces with U+2581 inside
  kBpeLlama3,    // gpt2 with the llama3 pre-tokenizer (adds BOS), a user-defined token
  kBpeQwen2,     // gpt2 with the qwen2 pre-tokenizer
};
inline constexpr int kNumFuzzVocabs = 4;

// The tokenizer of `v`, built on first use and kept for the process. PD_CHECK-fails when the
// vocabulary does not load (a harness bug, not a finding).
const engine::Tokenizer& GetTokenizer(FuzzVocab v);

// The GGUF bytes the tokenizer of `v` is read from (a vocabulary-only file).
std::string VocabGguf(FuzzVocab v);

// `s` in GPT-2's byte-level alphabet (each byte as its printable code point, UTF-8).
std::string ByteLevel(std::string_view s);

// The user-defined token of kSpmNoPrefix and the BPE vocabularies.
inline constexpr std::string_view kUserDefinedToken = "<tool_call>";

}  // namespace pd::fuzz
