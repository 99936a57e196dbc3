#include "engine/tokenizer/unicode.h"

#include <algorithm>

#include "common/status.h"
#include "engine/tokenizer/unicode_data.h"

namespace pd::engine::tokenizer_internal {
namespace {

// The byte-level alphabet: printable Latin-1 bytes stand for themselves, the other 68 byte values
// are assigned code points 256, 257, ... in increasing byte order.
struct ByteAlphabet {
  std::array<std::string, 256> utf8;
  std::array<int16_t, 256 + 68> byte_of_cpt;

  ByteAlphabet() {
    byte_of_cpt.fill(-1);
    int next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      const uint32_t cpt = printable ? b : next++;
      AppendUtf8(cpt, &utf8[b]);
      byte_of_cpt[cpt] = static_cast<int16_t>(b);
    }
    PD_CHECK(next == 256 + 68);
  }
};

const ByteAlphabet& Alphabet() {
  static const ByteAlphabet* const kAlphabet = new ByteAlphabet();
  return *kAlphabet;
}

bool IsCont(uint8_t b) { return (b & 0xC0) == 0x80; }

}  // namespace

void AppendUtf8(uint32_t cpt, std::string* out) {
  PD_CHECK(cpt <= 0x10FFFF);
  if (cpt < 0x80) {
    out->push_back(static_cast<char>(cpt));
  } else if (cpt < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cpt >> 6)));
    out->push_back(static_cast<char>(0x80 | (cpt & 0x3F)));
  } else if (cpt < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cpt >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cpt >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cpt & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cpt >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cpt >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cpt >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cpt & 0x3F)));
  }
}

std::vector<uint32_t> DecodeUtf8Lenient(std::string_view bytes) {
  std::vector<uint32_t> out;
  out.reserve(bytes.size());
  const auto* s = reinterpret_cast<const uint8_t*>(bytes.data());
  const size_t n = bytes.size();
  size_t i = 0;
  while (i < n) {
    const uint8_t b0 = s[i];
    if (b0 < 0x80) {
      out.push_back(b0);
      i += 1;
      continue;
    }
    // Number of continuation bytes the lead asks for; 0 means "not a lead byte".
    size_t extra = 0;
    uint32_t cpt = 0;
    if ((b0 & 0xE0) == 0xC0) {
      extra = 1;
      cpt = b0 & 0x1F;
    } else if ((b0 & 0xF0) == 0xE0) {
      extra = 2;
      cpt = b0 & 0x0F;
    } else if ((b0 & 0xF8) == 0xF0) {
      extra = 3;
      cpt = b0 & 0x07;
    }
    // The sequence needs bytes i+1 .. i+extra, all of them continuation bytes.
    bool ok = extra > 0 && i + extra < n;
    for (size_t k = 1; ok && k <= extra; ++k) ok = IsCont(s[i + k]);
    if (!ok) {
      out.push_back(kReplacementChar);
      i += 1;
      continue;
    }
    for (size_t k = 1; k <= extra; ++k) cpt = (cpt << 6) | (s[i + k] & 0x3F);
    out.push_back(cpt);
    i += 1 + extra;
  }
  return out;
}

const std::string& ByteToUnicodeUtf8(uint8_t b) { return Alphabet().utf8[b]; }

int UnicodeToByte(uint32_t cpt) {
  const auto& a = Alphabet();
  return cpt < a.byte_of_cpt.size() ? a.byte_of_cpt[cpt] : -1;
}

std::string SanitizeUtf8(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    bool incomplete;
    size_t bad;
    const size_t len = Utf8ValidSeqLen(s.substr(i), &incomplete, &bad);
    if (len > 0) {
      out.append(s.data() + i, len);
      i += len;
    } else {
      AppendUtf8(kReplacementChar, &out);
      i += incomplete ? s.size() - i : bad;
    }
  }
  return out;
}

CharClass ClassOf(uint32_t cpt) {
  if (cpt >= 0x110000) return CharClass::kOther;
  const absl::Span<const uint32_t> ranges = unicode_data::ClassRanges();
  // The last run starting at or before cpt (entries compare by their first code point, cpt << 2
  // | 3 being above every entry that starts at cpt).
  const auto it = std::upper_bound(ranges.begin(), ranges.end(), (cpt << 2) | 3u);
  return static_cast<CharClass>(*(it - 1) & 3u);
}

bool IsWhiteSpace(uint32_t cpt) {
  if (cpt <= 0x20) return cpt == 0x20 || (cpt >= 0x09 && cpt <= 0x0D);
  if (cpt < 0x85) return false;
  return cpt == 0x85 || cpt == 0xA0 || cpt == 0x1680 || (cpt >= 0x2000 && cpt <= 0x200A) ||
         cpt == 0x2028 || cpt == 0x2029 || cpt == 0x202F || cpt == 0x205F || cpt == 0x3000;
}

uint32_t SimpleLowercase(uint32_t cpt) {
  if (cpt < 0x80) return cpt >= 'A' && cpt <= 'Z' ? cpt + 32 : cpt;
  const absl::Span<const unicode_data::LowercaseRun> runs = unicode_data::LowercaseRuns();
  // The last run starting at or before cpt; it maps cpt when cpt is one of its members.
  auto it =
      std::upper_bound(runs.begin(), runs.end(), cpt,
                       [](uint32_t c, const unicode_data::LowercaseRun& r) { return c < r.first; });
  if (it == runs.begin()) return cpt;
  const unicode_data::LowercaseRun& r = *(it - 1);
  const uint32_t off = cpt - r.first;
  if (off % r.stride != 0 || off / r.stride >= r.count) return cpt;
  return static_cast<uint32_t>(static_cast<int64_t>(cpt) + r.delta);
}

uint32_t NfdFirst(uint32_t cpt) {
  if (cpt < 0xC0) return cpt;
  // Hangul syllables: the leading consonant, U+1100 + (cpt - U+AC00) / (21 vowels * 28 tails).
  if (cpt >= 0xAC00 && cpt <= 0xD7A3) return 0x1100 + (cpt - 0xAC00) / 588;
  const absl::Span<const unicode_data::NfdFirstPair> pairs = unicode_data::NfdFirstPairs();
  const auto it =
      std::lower_bound(pairs.begin(), pairs.end(), cpt,
                       [](const unicode_data::NfdFirstPair& p, uint32_t c) { return p.cpt < c; });
  return it != pairs.end() && it->cpt == cpt ? it->first : cpt;
}

}  // namespace pd::engine::tokenizer_internal
