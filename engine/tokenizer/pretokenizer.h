// Regex pre-tokenizer for byte-level BPE vocabularies (llama.cpp's `tokenizer.ggml.pre`).
//
// A pre-tokenizer is a list of PCRE2 patterns (UTF + UCP, JIT-compiled when the library has JIT).
// They are applied one after another: each pattern re-splits every piece the previous one produced,
// and both its matches and the unmatched gaps between them become pieces. A pattern never sees
// past the end of the piece it splits (lookaheads stop there), as in llama.cpp.
//
// Patterns are written as llama.cpp's tables write them and mean what they mean there (Rewrite in
// pretokenizer.cc): \p{L}, \p{N}, \p{P}, \p{M}, \p{S} are the general categories (from PCRE2's
// tables), \p{Lu} and the other letter subclasses mean any letter, \s / \S the Unicode
// White_Space property (PCRE2's own \s also matches U+180E), \d ASCII digits and \b an ASCII
// word boundary.
//
// The types are rows of one table (pretokenizer.cc, Rows()): the `tokenizer.ggml.pre` names that
// select a type, its patterns and its flags. Every name llama.cpp's vocabulary loader accepts is
// a row.
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
  // false: BPE over the text's own UTF-8 (symbols are characters, unknown ones fall back to
  // <0xXX> byte tokens) instead of GPT-2's byte-level alphabet (Gemma 4's SentencePiece-style BPE).
  bool byte_encode = true;
  bool escape_spaces = false;  // spaces become U+2581 before splitting, and back when decoding
  // A piece of newlines only that is a token is that token (Gemma 4: its merges never join
  // newlines, but its vocabulary holds runs of them).
  bool whole_newline_runs = false;
  // BOS is added even when tokenizer.ggml.add_bos_token says false, if the vocabulary has one
  // (llama.cpp overrides the key for Gemma 4, whose converted files carry a wrong false).
  bool force_add_bos = false;
  // Default for tokenizer.ggml.add_sep_token (encoders that join two texts with a separator:
  // jina-v1-en, jina-v2-code, roberta-bpe). Tokenizing one text is unchanged (Tokenizer::add_sep).
  bool add_sep = false;
};

// The spec for a pre-tokenizer name. An empty name means "default", as in llama.cpp.
// INVALID_ARGUMENT for a name nobody knows.
absl::StatusOr<PreTokenizerSpec> PreTokenizerSpecFor(std::string_view pre);

// Every name PreTokenizerSpecFor accepts, in table order.
std::vector<std::string_view> SupportedPreTokenizers();

// A pattern that is not a regex: llama.cpp's digit grouping (its AFMoE split, which it also runs
// for Tiny Aya's "\d{1,3}(?=(?:\d{3})*\b)"). Every run of numbers (\p{N}) is cut at its end and
// at every third code point before that; the text before a run stays with its first group.
inline constexpr char kDigitGroups[] = "@digit-groups";

class PreTokenizer {
 public:
  // Compiles `patterns` (regexes, or kDigitGroups). INVALID_ARGUMENT with PCRE2's message and
  // offset if one does not compile.
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
