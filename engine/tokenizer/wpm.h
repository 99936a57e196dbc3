// Internals of the WordPiece tokenizer (tokenizer.ggml.model = bert, llama.cpp's "WPM"): the
// model state and the word splitter. The encoder itself is Tokenizer::EncodeWpm (wpm.cc, which
// describes the algorithm).
//
// Thread safety: immutable after creation; const methods and SplitWpmWords may be called
// concurrently.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "engine/tokenizer/token_trie.h"

namespace pd::engine::tokenizer_internal {

// What a WordPiece vocabulary needs beyond the token table.
struct WpmModel {
  TokenTrie matcher;  // every token's text, as llama.cpp's text-to-id map holds them
  // tokenizer.ggml.normalizer.lowercase (default true) and .strip_accents (default: lowercase),
  // BERT's BasicTokenizer options as llama.cpp reads them.
  bool lowercase = true;
  bool strip_accents = true;
};

// The words of `text` as WordPiece sees them (step 1 in wpm.cc): appends their normalized UTF-8 to
// *norm and each word's [begin, end) byte range in *norm to *words. Words are never empty. `text`
// may be any bytes.
void SplitWpmWords(std::string_view text, const WpmModel& model, std::string* norm,
                   std::vector<std::pair<size_t, size_t>>* words);

}  // namespace pd::engine::tokenizer_internal
