// Synthetic prompts of a requested token count.
//
// A prompt of N tokens is N words drawn (with a seeded generator) from a fixed list of common
// lower-case English words, joined by single spaces. Every word of the list is one token, with or
// without its leading space, in the Llama / Gemma SentencePiece vocabularies and in the GPT-2-style
// byte-level BPE vocabularies (checked in tests/bench/pd_bench/prompt_test.cc), so the text
// tokenizes to exactly N tokens there; the server adds its own BOS / template tokens on top, and
// pd-bench reports the server's usage.prompt_tokens next to the requested count. Random words make
// prompts differ between requests, so no prefix cache can serve one request from another.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace pd::bench {

// The word list (read-only, static storage).
const std::vector<std::string_view>& PromptWords();

// `tokens` (>= 1) words; the same (tokens, seed) gives the same text.
std::string BuildPrompt(int tokens, uint64_t seed);

// A seed for the item (a, b, c), e.g. (run seed, arrival process, sequence number): splitmix64
// applied in turn, so that neighbouring tuples get unrelated seeds.
uint64_t MixSeed(uint64_t a, uint64_t b, uint64_t c);

}  // namespace pd::bench
