// UTF-8 helpers for the tokenizers. Internal to engine/tokenizer.
//
// Two decoders live here on purpose:
//  - a *lenient* one that reproduces how llama.cpp turns arbitrary input bytes into code points
//    (so that our token ids match its ids on any input, valid UTF-8 or not), and
//  - a *strict* one (Unicode "maximal subpart" replacement) for what we hand to clients, which must
//    always be valid UTF-8.
// Character classes of the regex pre-tokenizers are PCRE2's business (pretokenizer.h). The few
// properties the WordPiece normalizer needs (wpm.cc) are looked up here, in tables generated from
// the Unicode version llama.cpp's own tables hold (unicode_data.h).
//
// Thread safety: pure functions and immutable tables.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/utf8.h"

namespace pd::engine::tokenizer_internal {

inline constexpr uint32_t kReplacementChar = 0xFFFD;

// Length of the UTF-8 sequence that `lead` would start, judged only by its high nibble:
// 0x0-0xB -> 1 (ASCII and stray continuation bytes), 0xC-0xD -> 2, 0xE -> 3, 0xF -> 4.
// This is how llama.cpp chops text into initial BPE/SPM symbols; it never validates.
inline size_t Utf8SeqLenByLead(uint8_t lead) {
  static constexpr uint8_t kLen[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
  return kLen[lead >> 4];
}

// Appends the UTF-8 encoding of `cpt` (<= 0x10FFFF; surrogates are encoded as their 3-byte form,
// as llama.cpp does). Precondition: cpt <= 0x10FFFF (PD_CHECKed).
void AppendUtf8(uint32_t cpt, std::string* out);

// Lenient decoding, exactly like llama.cpp's unicode_cpts_from_utf8(): a lead byte with the right
// number of continuation bytes decodes without further checks (so overlong forms, surrogates and
// values up to 0x1FFFFF come through); anything else yields U+FFFD and skips ONE byte.
std::vector<uint32_t> DecodeUtf8Lenient(std::string_view bytes);

// GPT-2 byte-level alphabet: every byte value maps to one printable code point.
// ByteToUnicodeUtf8(b) is that code point's UTF-8; UnicodeToByte(cpt) inverts it (-1 if `cpt` is
// not in the alphabet).
const std::string& ByteToUnicodeUtf8(uint8_t b);
int UnicodeToByte(uint32_t cpt);

// Strict UTF-8 (common/utf8.h): the tokenizer's streaming detokenizer and SanitizeUtf8 use it.
using ::pd::Utf8ValidSeqLen;

// Replaces every invalid or truncated sequence in `s` by U+FFFD (one per maximal subpart).
std::string SanitizeUtf8(std::string_view s);

// ---- Character properties (Unicode 15.1, as llama.cpp's tables; unicode_data.h) ----
// Code points above U+10FFFF have no properties: class kOther, no mappings.

// The general-category classes WordPiece tells apart.
enum class CharClass : uint8_t {
  kOther = 0,        // letters, numbers, symbols, separators, unassigned (Cn)
  kControl = 1,      // Cc, Cf, Co, Cs
  kMark = 2,         // Mn, Mc, Me
  kPunctuation = 3,  // Pc, Pd, Ps, Pe, Pi, Pf, Po
};
CharClass ClassOf(uint32_t cpt);

// The White_Space property: U+0009-U+000D, U+0020, U+0085, U+00A0, U+1680, U+2000-U+200A, U+2028,
// U+2029, U+202F, U+205F, U+3000.
bool IsWhiteSpace(uint32_t cpt);

// UnicodeData.txt's simple lowercase mapping of `cpt` (cpt itself when it has none).
uint32_t SimpleLowercase(uint32_t cpt);

// The first code point of the canonical decomposition (NFD) of `cpt`, cpt itself when it has
// none: U+00E9 -> U+0065, U+AC00 -> U+1100. What follows the first code point is not given.
uint32_t NfdFirst(uint32_t cpt);

}  // namespace pd::engine::tokenizer_internal
