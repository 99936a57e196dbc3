// Special-token handling, encoding and decoding. Loading is in tokenizer_load.cc, the encoders of
// each model in spm.cc, bpe.cc, ugm.cc and wpm.cc.
#include "engine/tokenizer/tokenizer.h"

#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "engine/tokenizer/unicode.h"

namespace pd::engine {
namespace {

constexpr std::string_view kSpaceEscape = "\xE2\x96\x81";  // U+2581, SentencePiece's space

// C-locale isspace, the whitespace that LSTRIP/RSTRIP tokens eat.
bool IsAsciiSpace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r';
}

// llama.cpp's clean_up_tokenization_spaces, three in-place passes over the decoded bytes.
void CleanSpaces(std::string* s) {
  std::string& t = *s;
  // 1: " ?", " !", " .", " ," lose the space.
  size_t total = t.empty() ? 0 : 1;
  for (size_t i = 1, n = t.size(); i < n; ++i) {
    const char x = t[i];
    if (t[i - 1] == ' ' && (x == '?' || x == '!' || x == '.' || x == ',')) --total;
    t[total++] = x;
  }
  t.resize(total);
  // 2: " ' " loses both spaces.
  total = t.empty() ? 0 : 1;
  for (size_t i = 1, n = t.size(); i < n; ++i) {
    const char x = t[i];
    if (x == '\'' && i + 1 < n && t[i - 1] == ' ' && t[i + 1] == ' ') {
      --total;
      t[++i] = '\0';  // the next space is skipped (and no longer counts as a space)
    }
    t[total++] = x;
  }
  t.resize(total);
  // 3: " 's", " 'm", " 're", " 've" lose the space.
  total = t.empty() ? 0 : 1;
  for (size_t i = 1, n = t.size(); i < n; ++i) {
    const char x = t[i];
    if (t[i - 1] == ' ' && x == '\'' && i + 1 < n) {
      const char x1 = t[i + 1];
      if (x1 == 's' || x1 == 'm') {
        --total;
      } else if (x1 != 't' && x1 != 'd' && i + 2 < n) {
        const char x2 = t[i + 2];
        if ((x1 == 'r' && x2 == 'e') || (x1 == 'v' && x2 == 'e')) --total;
      }
    }
    t[total++] = x;
  }
  t.resize(total);
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Accessors

const std::string& Tokenizer::token_text(int32_t id) const {
  PD_CHECK(IsValid(id));
  return tokens_[id].text;
}
float Tokenizer::token_score(int32_t id) const {
  PD_CHECK(IsValid(id));
  return tokens_[id].score;
}
TokenType Tokenizer::token_type(int32_t id) const {
  PD_CHECK(IsValid(id));
  return tokens_[id].type;
}
uint32_t Tokenizer::token_attrs(int32_t id) const {
  PD_CHECK(IsValid(id));
  return tokens_[id].attrs;
}
bool Tokenizer::IsControl(int32_t id) const {
  return IsValid(id) && (tokens_[id].attrs & TokenAttr::kControl);
}
bool Tokenizer::IsEog(int32_t id) const { return IsValid(id) && tokens_[id].eog; }

// ---------------------------------------------------------------------------------------------
// Encoding

std::vector<Tokenizer::Fragment> Tokenizer::Partition(std::string_view text,
                                                      bool parse_special) const {
  std::vector<Fragment> frags;
  if (text.empty()) return frags;
  frags.push_back({kNoToken, 0, text.size()});
  std::vector<Fragment> next;
  for (const int32_t special : special_tokens_) {
    const Token& tok = tokens_[special];
    if (!parse_special && (tok.attrs & (TokenAttr::kControl | TokenAttr::kUnknown))) continue;
    const std::string_view needle = tok.text;
    next.clear();
    bool changed = false;
    for (const Fragment& f : frags) {
      if (f.token != kNoToken) {
        next.push_back(f);
        continue;
      }
      const std::string_view upto = text.substr(0, f.end);
      size_t pos = f.begin;
      while (true) {
        const size_t hit = upto.find(needle, pos);
        if (hit == std::string_view::npos) break;
        changed = true;
        size_t left_end = hit;
        if (tok.attrs & TokenAttr::kLstrip) {
          while (left_end > pos && IsAsciiSpace(text[left_end - 1])) --left_end;
        }
        if (left_end > pos) next.push_back({kNoToken, pos, left_end});
        next.push_back({special, hit, hit + needle.size()});
        pos = hit + needle.size();
        if (tok.attrs & TokenAttr::kRstrip) {
          while (pos < f.end && IsAsciiSpace(text[pos])) ++pos;
        }
      }
      if (pos < f.end) next.push_back({kNoToken, pos, f.end});
    }
    if (changed) frags.swap(next);
  }
  return frags;
}

std::vector<int32_t> Tokenizer::Encode(std::string_view text, bool add_special,
                                       bool parse_special) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 4);
  const std::vector<Fragment> frags = Partition(text, parse_special);
  // WordPiece: [CLS] and [SEP] whatever add_bos/add_eos say (LoadWpm checked that both exist).
  const bool wpm = model_ == TokenizerModel::kWpm;
  if (add_special && (add_bos_ || wpm)) out.push_back(bos_);
  if (model_ == TokenizerModel::kSpm) {
    bool prev_special = true;  // the first run of text gets the space prefix too
    std::string escaped;
    for (const Fragment& f : frags) {
      if (f.token != kNoToken) {
        out.push_back(f.token);
        prev_special = true;
        continue;
      }
      escaped.clear();
      if (add_space_prefix_ && prev_special) escaped = kSpaceEscape;
      for (char c : text.substr(f.begin, f.end - f.begin)) {
        if (c == ' ') {
          escaped += kSpaceEscape;
        } else {
          escaped.push_back(c);
        }
      }
      EncodeSpm(escaped, &out);
      prev_special = false;
    }
  } else if (model_ == TokenizerModel::kUgm) {
    // Each run of text is normalized on its own, space prefix included (as llama.cpp does).
    for (const Fragment& f : frags) {
      if (f.token != kNoToken) {
        out.push_back(f.token);
      } else {
        EncodeUgm(text.substr(f.begin, f.end - f.begin), &out);
      }
    }
  } else if (wpm) {
    for (const Fragment& f : frags) {
      if (f.token != kNoToken) {
        out.push_back(f.token);
      } else {
        EncodeWpm(text.substr(f.begin, f.end - f.begin), &out);
      }
    }
  } else {
    for (const Fragment& f : frags) {
      if (f.token != kNoToken) {
        out.push_back(f.token);
      } else {
        EncodeBpe(text.substr(f.begin, f.end - f.begin), &out);
      }
    }
  }
  if (add_special && wpm) {
    out.push_back(sep_);
  } else if (add_special && add_eos_) {
    out.push_back(eos_);
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Decoding

std::string Tokenizer::TokenToPiece(int32_t id, bool render_special) const {
  if (!IsValid(id)) return std::string();
  const Token& t = tokens_[id];
  if (!render_special && (t.attrs & (TokenAttr::kUnknown | TokenAttr::kControl))) {
    return std::string();
  }
  return t.piece;
}

std::string Tokenizer::Decode(absl::Span<const int32_t> ids, const DecodeOptions& options) const {
  bool strip_space = add_space_prefix_;
  if (options.remove_special && add_bos_ && !ids.empty() && ids.front() == bos_) {
    strip_space = false;
    ids.remove_prefix(1);
  }
  if (options.remove_special && add_eos_ && !ids.empty() && ids.back() == eos_) {
    ids.remove_suffix(1);
  }
  std::string out;
  for (const int32_t id : ids) {
    if (!IsValid(id)) continue;
    const Token& t = tokens_[id];
    const bool hidden =
        !options.render_special && (t.attrs & (TokenAttr::kUnknown | TokenAttr::kControl));
    if (!hidden) {
      const bool strip = strip_space && !t.piece.empty() && t.piece[0] == ' ';
      out.append(t.piece, strip ? 1 : 0, std::string::npos);
    }
    strip_space = false;
  }
  if (options.clean_spaces) CleanSpaces(&out);
  return out;
}

std::string StreamingDetokenizer::Push(int32_t id) {
  // As in Decode(): an id out of range is skipped, so it is not "the first token" either.
  if (!tokenizer_.IsValid(id)) return std::string();
  std::string piece = tokenizer_.TokenToPiece(id, options_.render_special);
  if (first_ && options_.strip_leading_space && tokenizer_.add_space_prefix() && !piece.empty() &&
      piece[0] == ' ') {
    piece.erase(0, 1);
  }
  first_ = false;
  pending_ += piece;
  // Emit every complete or hopeless sequence; keep a trailing incomplete one.
  std::string out;
  size_t i = 0;
  while (i < pending_.size()) {
    bool incomplete;
    size_t bad;
    const size_t len = tokenizer_internal::Utf8ValidSeqLen(std::string_view(pending_).substr(i),
                                                           &incomplete, &bad);
    if (len > 0) {
      out.append(pending_, i, len);
      i += len;
    } else if (incomplete) {
      break;
    } else {
      tokenizer_internal::AppendUtf8(tokenizer_internal::kReplacementChar, &out);
      i += bad;
    }
  }
  pending_.erase(0, i);
  return out;
}

std::string StreamingDetokenizer::Flush() {
  std::string out = tokenizer_internal::SanitizeUtf8(pending_);
  pending_.clear();
  first_ = true;
  return out;
}

}  // namespace pd::engine
