// The Unicode character data of the WordPiece normalizer (wpm.cc): the tables llama.cpp 0.3.36's
// WordPiece tokenizer reads, from the same Unicode version (15.1.0). unicode_data.cc is generated
// by scripts/gen_unicode_data.py (which says where each table comes from); do not edit it. The
// lookups over these tables are in unicode.h.
//
// Thread safety: constant tables.
#pragma once

#include <cstdint>

#include "absl/types/span.h"

namespace pd::engine::tokenizer_internal::unicode_data {

inline constexpr char kUnicodeVersion[] = "15.1.0";

// Runs of code points of one class (unicode.h, CharClass): entry i is (first << 2 | class) and
// its run ends where entry i + 1 begins. Sorted; the first entry is code point 0; the last run
// ends at U+10FFFF.
absl::Span<const uint32_t> ClassRanges();

// The simple lowercase mapping: the `count` code points first, first + stride, ... map to
// themselves plus `delta`. Sorted by `first`; runs do not overlap.
struct LowercaseRun {
  uint32_t first;
  uint32_t count;
  uint32_t stride;
  int32_t delta;
};
absl::Span<const LowercaseRun> LowercaseRuns();

// Code points whose canonical decomposition (NFD) starts with another code point, and that code
// point. Sorted by `cpt`. Hangul syllables are not listed (unicode.cc computes theirs).
struct NfdFirstPair {
  uint32_t cpt;
  uint32_t first;
};
absl::Span<const NfdFirstPair> NfdFirstPairs();

}  // namespace pd::engine::tokenizer_internal::unicode_data
