// Strict UTF-8 validation (no overlongs, no surrogates, nothing past U+10FFFF), in one place for
// the tokenizer's streaming detokenizer and the front end's request checks.
#pragma once

#include <cstddef>
#include <string_view>

namespace pd {

// Length of the valid, complete sequence at the start of `s`, or 0 if `s` does not start with
// one. *incomplete is set when `s` is a proper prefix of a valid sequence (so more bytes could
// still complete it); otherwise the bytes are invalid and *invalid_len is the length of the
// maximal subpart to replace with one U+FFFD (>= 1).
size_t Utf8ValidSeqLen(std::string_view s, bool* incomplete, size_t* invalid_len);

// Offset of the first byte that does not start a complete, valid sequence; npos when `s` is
// valid UTF-8.
size_t FirstInvalidUtf8(std::string_view s);

// FirstInvalidUtf8(s) == npos.
bool IsValidUtf8(std::string_view s);

}  // namespace pd
