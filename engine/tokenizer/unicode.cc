#include "engine/tokenizer/unicode.h"

#include "common/status.h"

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

}  // namespace pd::engine::tokenizer_internal
