// Regex pre-tokenizer for byte-level BPE vocabularies (llama.cpp's `tokenizer.ggml.pre`).
//
// A pre-tokenizer is a list of PCRE2 patterns (UTF + UCP, JIT-compiled when the library has JIT).
// They are applied one after another: each pattern re-splits every piece the previous one produced,
// and both its matches and the unmatched gaps between them become pieces. A pattern never sees
// past the end of the piece it splits (lookaheads stop there), as in llama.cpp.
//
// Character classes follow llama.cpp's Unicode semantics: \p{L}, \p{N}, \p{P} are the general
// categories (from PCRE2's tables) and \s / \S are rewritten to the Unicode White_Space property,
// which is what llama.cpp uses (PCRE2's own \s also matches U+180E).
//
// Thread safety: immutable after Create(); Split() may be called from many threads at once (each
// thread keeps its own PCRE2 match data and JIT stack).
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace pd::engine::tokenizer_internal {

// What a `tokenizer.ggml.pre` value implies.
struct PreTokenizerSpec {
  std::vector<std::string> patterns;  // PCRE2 syntax, applied in order
  bool clean_spaces = true;    // llama.cpp's default for decoding (clean_up_tokenization_spaces)
  bool ignore_merges = false;  // a whole piece that is a token is emitted as is
  bool add_bos = false;        // default for tokenizer.ggml.add_bos_token
  bool bos_disabled = false;   // the pre type has no BOS token (chatglm)
};

// The spec for a pre-tokenizer name; INVALID_ARGUMENT naming the value when it is not supported.
// An empty name means "default", as in llama.cpp.
absl::StatusOr<PreTokenizerSpec> PreTokenizerSpecFor(std::string_view pre);

class PreTokenizer {
 public:
  // Compiles `patterns`. INVALID_ARGUMENT with PCRE2's message and offset if one does not compile.
  static absl::StatusOr<std::unique_ptr<PreTokenizer>> Create(
      const std::vector<std::string>& patterns);
  ~PreTokenizer();
  PreTokenizer(const PreTokenizer&) = delete;
  PreTokenizer& operator=(const PreTokenizer&) = delete;

  // Splits `text` into consecutive non-empty pieces covering it; appends their [begin, end) byte
  // ranges to *pieces. Precondition: `text` is valid UTF-8 (the caller normalises it first).
  void Split(std::string_view text, std::vector<std::pair<size_t, size_t>>* pieces) const;

 private:
  struct Pattern;
  PreTokenizer() = default;
  std::vector<std::unique_ptr<Pattern>> patterns_;
};

}  // namespace pd::engine::tokenizer_internal
