#include "common/utf8.h"

#include <cstdint>

namespace pd {

size_t Utf8ValidSeqLen(std::string_view str, bool* incomplete, size_t* invalid_len) {
  *incomplete = false;
  *invalid_len = 0;
  if (str.empty()) {
    *incomplete = true;
    return 0;
  }
  const auto* s = reinterpret_cast<const uint8_t*>(str.data());
  const size_t n = str.size();
  const uint8_t b0 = s[0];
  if (b0 < 0x80) return 1;
  size_t need;                   // total length of the sequence
  uint8_t lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 3;
    if (b0 == 0xE0) lo = 0xA0;  // no overlongs
    if (b0 == 0xED) hi = 0x9F;  // no surrogates
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 4;
    if (b0 == 0xF0) lo = 0x90;  // no overlongs
    if (b0 == 0xF4) hi = 0x8F;  // nothing above U+10FFFF
  } else {
    *invalid_len = 1;  // 0x80-0xC1, 0xF5-0xFF can never start a sequence
    return 0;
  }
  for (size_t k = 1; k < need; ++k) {
    if (k >= n) {
      *incomplete = true;
      return 0;
    }
    const uint8_t lo_k = k == 1 ? lo : 0x80;
    const uint8_t hi_k = k == 1 ? hi : 0xBF;
    if (s[k] < lo_k || s[k] > hi_k) {
      *invalid_len = k;
      return 0;
    }
  }
  return need;
}

size_t FirstInvalidUtf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    bool incomplete;
    size_t bad;
    const size_t len = Utf8ValidSeqLen(s.substr(i), &incomplete, &bad);
    if (len == 0) return i;
    i += len;
  }
  return std::string_view::npos;
}

bool IsValidUtf8(std::string_view s) { return FirstInvalidUtf8(s) == std::string_view::npos; }

}  // namespace pd
