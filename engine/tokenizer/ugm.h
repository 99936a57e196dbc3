// Internals of the Unigram tokenizer (tokenizer.ggml.model = t5, llama.cpp's "UGM"): the
// SentencePiece precompiled character map and the model state (its byte trie: token_trie.h). The
// encoder itself is Tokenizer::EncodeUgm (ugm.cc).
//
// Thread safety: immutable after creation; const methods may be called concurrently.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/tokenizer/token_trie.h"

namespace pd::engine::tokenizer_internal {

// SentencePiece's precompiled normalization map (`tokenizer.ggml.precompiled_charsmap`, the
// `precompiled_charsmap` of a SentencePiece model or of a tokenizers Precompiled normalizer):
//   uint32 LE   trie_size: bytes of the trie that follows (a multiple of 4)
//   trie_size   darts-clone double array, one uint32 LE unit per node
//   rest        NUL-terminated replacement strings; a trie value is an offset into them
// A unit holds: bits 0-7 the label (with bit 31, which no byte label has, on value units), bit 8
// "has a value" (the child at offset ^ 0 holds it), bits 10-30 the offset to the children
// (shifted left by 8 more when bit 9 is set); a value unit holds the value in bits 0-30.
class PrecompiledCharsmap {
 public:
  // Parses and checks the whole map, since it comes from a file: INVALID_ARGUMENT when it is too
  // short for its header, the trie size is not a multiple of 4 or leaves no room for the strings,
  // a node reachable from the root lies outside the trie, or a value points outside the strings
  // or to a string with no terminating NUL.
  static absl::StatusOr<std::unique_ptr<PrecompiledCharsmap>> Parse(absl::Span<const uint8_t> blob);

  // The longest key that is a prefix of `text` (a NUL byte ends the search): its length, and its
  // replacement in *replacement; 0 when no key matches.
  size_t Match(std::string_view text, std::string_view* replacement) const;

  size_t num_units() const { return units_.size(); }

 private:
  PrecompiledCharsmap() = default;
  absl::Status Check() const;
  std::string_view Replacement(uint32_t offset) const;

  std::vector<uint32_t> units_;
  std::string strings_;
};

// What a Unigram vocabulary needs beyond the token table.
struct UgmModel {
  TokenTrie matcher;  // normal, user-defined and unused tokens, as llama.cpp's
  std::unique_ptr<PrecompiledCharsmap> charsmap;  // null: no normalization map
  // llama.cpp keeps this in float: the lowest score of a normal token, minus 10.
  float unknown_score = 0;
  bool remove_extra_whitespaces = false;  // tokenizer.ggml.remove_extra_whitespaces
  bool byte_fallback = false;             // the vocabulary has byte tokens
};

}  // namespace pd::engine::tokenizer_internal
