// Unigram tokenization (tokenizer.ggml.model = t5), id-compatible with llama.cpp's UGM tokenizer.
//
// Each run of text between special tokens is handled on its own:
//  1. Normalization. At each input position the longest key of the precompiled charsmap that
//     starts there is replaced by its string; otherwise a valid UTF-8 sequence (judged as leniently
//     as llama.cpp: lead byte and continuation bytes only) is copied, and any other byte becomes
//     U+FFFD. Every ASCII space of the result is then written as U+2581. A U+2581 is put before
//     the first non-space byte when add_space_prefix; with remove_extra_whitespaces, leading and
//     trailing spaces are dropped and each run of spaces inside becomes one U+2581 (in llama.cpp
//     that also puts the U+2581 before the first word whatever add_space_prefix says).
//  2. Viterbi search over the normalized bytes, one UTF-8 character (cut by its lead byte) at a
//     time: every token of the trie that starts at the character is a candidate edge scored by
//     its log probability (user-defined tokens score 0); when no token covers exactly the one
//     character, the unknown token does, scored min(normal scores) - 10. A candidate replaces the
//     best path to its end only when strictly better, so on ties the edge that starts earliest
//     (then the shortest) wins. Sums are kept in double, as llama.cpp keeps them.
//  3. Backtracking; adjacent unknown tokens become one. Where the vocabulary has byte tokens
//     <0xXX>, a run of unknown text becomes the byte tokens of its normalized bytes instead (as
//     SentencePiece and Hugging Face do with byte_fallback; llama.cpp emits the unknown token).
//
// Costs: normalization is linear in the text (times the longest charsmap key); the search visits,
// for each character, the trie path below it, so it is O(n * longest token).
#include "engine/tokenizer/ugm.h"

#include <algorithm>
#include <cfloat>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"
#include "common/strings.h"
#include "engine/tokenizer/tokenizer.h"
#include "engine/tokenizer/unicode.h"

namespace pd::engine {
namespace tokenizer_internal {
namespace {

constexpr std::string_view kCharsmapKey = "tokenizer.ggml.precompiled_charsmap";

// Fields of a double-array unit.
uint32_t UnitLabel(uint32_t u) { return u & (0x80000000u | 0xFFu); }
bool UnitHasValue(uint32_t u) { return ((u >> 8) & 1) != 0; }
uint32_t UnitOffset(uint32_t u) { return (u >> 10) << ((u & (1u << 9)) >> 6); }
uint32_t UnitValue(uint32_t u) { return u & 0x7FFFFFFFu; }

uint32_t ReadLe32(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) |
         (static_cast<uint32_t>(p[2]) << 16) | (static_cast<uint32_t>(p[3]) << 24);
}

absl::Status Malformed(std::string_view what) {
  return absl::InvalidArgumentError(StrCat(kCharsmapKey, ": ", what));
}

}  // namespace

absl::StatusOr<std::unique_ptr<PrecompiledCharsmap>> PrecompiledCharsmap::Parse(
    absl::Span<const uint8_t> blob) {
  if (blob.size() < 4) {
    return Malformed(StrCat("too short for its header (", blob.size(), " bytes, need 4)"));
  }
  const uint32_t trie_size = ReadLe32(blob.data());
  if (trie_size % 4 != 0) {
    return Malformed(StrCat("trie size ", trie_size, " is not a multiple of 4"));
  }
  // At least one byte of strings must follow, as llama.cpp requires.
  if (static_cast<uint64_t>(trie_size) + 4 >= blob.size()) {
    return Malformed(StrCat("trie size ", trie_size, " leaves no room for the strings in ",
                            blob.size(), " bytes"));
  }
  std::unique_ptr<PrecompiledCharsmap> map(new PrecompiledCharsmap());
  map->units_.resize(trie_size / 4);
  for (size_t i = 0; i < map->units_.size(); ++i) {
    map->units_[i] = ReadLe32(blob.data() + 4 + 4 * i);
  }
  map->strings_.assign(reinterpret_cast<const char*>(blob.data()) + 4 + trie_size,
                       blob.size() - 4 - trie_size);
  PD_RETURN_IF_ERROR(map->Check());
  return map;
}

// Walks every node reachable from the root, so that Match() can never leave the arrays: each
// child slot a byte can select (state ^ byte, for every byte 1-255) must lie inside the trie, as
// it always does in darts-clone's output (whole blocks of 256 units), and each value must name a
// terminated string.
absl::Status PrecompiledCharsmap::Check() const {
  const size_t n = units_.size();
  if (n == 0) return absl::OkStatus();  // an empty trie matches nothing
  const uint32_t root = UnitOffset(units_[0]);
  if (root >= n) {
    return Malformed(
        StrCat("the root's children (unit ", root, ") lie outside the trie of ", n, " units"));
  }
  std::vector<bool> seen(n, false);
  std::vector<uint32_t> stack = {root};
  seen[root] = true;
  while (!stack.empty()) {
    const uint32_t state = stack.back();
    stack.pop_back();
    for (uint32_t c = 1; c < 256; ++c) {
      const uint32_t slot = state ^ c;
      if (slot >= n) {
        return Malformed(StrCat("node slot ", slot, " (children at ", state, ", byte ", c,
                                ") lies outside the trie of ", n, " units"));
      }
      const uint32_t u = units_[slot];
      if (UnitLabel(u) != c) continue;
      const uint32_t next = slot ^ UnitOffset(u);
      if (next >= n) {
        return Malformed(
            StrCat("node ", slot, " points to unit ", next, ", outside the trie of ", n, " units"));
      }
      if (UnitHasValue(u)) {
        const uint32_t offset = UnitValue(units_[next]);
        if (offset >= strings_.size()) {
          return Malformed(StrCat("node ", slot, " names string offset ", offset,
                                  ", but there are ", strings_.size(), " bytes of strings"));
        }
        if (std::memchr(strings_.data() + offset, '\0', strings_.size() - offset) == nullptr) {
          return Malformed(StrCat("the string at offset ", offset, " has no terminating NUL"));
        }
      }
      if (!seen[next]) {
        seen[next] = true;
        stack.push_back(next);
      }
    }
  }
  return absl::OkStatus();
}

std::string_view PrecompiledCharsmap::Replacement(uint32_t offset) const {
  return std::string_view(strings_.data() + offset);  // terminated: checked by Check()
}

size_t PrecompiledCharsmap::Match(std::string_view text, std::string_view* replacement) const {
  const size_t n = units_.size();
  if (n == 0) return 0;
  size_t best = 0;
  uint32_t state = UnitOffset(units_[0]);
  for (size_t i = 0; i < text.size(); ++i) {
    const uint32_t c = static_cast<uint8_t>(text[i]);
    if (c == 0) break;
    const uint32_t slot = state ^ c;
    PD_CHECK(slot < n);  // Check() visited every reachable state
    const uint32_t u = units_[slot];
    if (UnitLabel(u) != c) break;
    state = slot ^ UnitOffset(u);
    PD_CHECK(state < n);
    if (UnitHasValue(u)) {
      best = i + 1;
      *replacement = Replacement(UnitValue(units_[state]));
    }
  }
  return best;
}

}  // namespace tokenizer_internal

namespace {

using tokenizer_internal::PrecompiledCharsmap;

constexpr std::string_view kSpaceEscape = "\xE2\x96\x81";  // U+2581
constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD
constexpr float kUnknownPenalty = 10.0f;

// Length of the UTF-8 sequence at the start of `s` when its lead byte has the continuation bytes
// it announces (no range, overlong or surrogate checks, as llama.cpp), else 0.
size_t LenientSeqLen(std::string_view s) {
  const uint8_t lead = static_cast<uint8_t>(s[0]);
  size_t len;
  if (lead < 0x80) {
    return 1;
  } else if (lead < 0xC0) {
    return 0;
  } else if (lead < 0xE0) {
    len = 2;
  } else if (lead < 0xF0) {
    len = 3;
  } else if (lead < 0xF8) {
    len = 4;
  } else {
    return 0;
  }
  if (s.size() < len) return 0;
  for (size_t i = 1; i < len; ++i) {
    if ((static_cast<uint8_t>(s[i]) & 0xC0) != 0x80) return 0;
  }
  return len;
}

}  // namespace

absl::Status Tokenizer::LoadUgm(const GgufFile& gguf) {
  auto ugm = std::make_unique<tokenizer_internal::UgmModel>();
  if (unk_ == kNoToken) {
    return absl::InvalidArgumentError(
        "tokenizer.ggml.model t5 needs an unknown token (tokenizer.ggml.unknown_token_id, default "
        "2), and the vocabulary has none");
  }
  absl::StatusOr<bool> remove_ws = gguf.GetBoolOr("tokenizer.ggml.remove_extra_whitespaces", false);
  if (!remove_ws.ok()) {
    return absl::InvalidArgumentError(StrCat("tokenizer.ggml.remove_extra_whitespaces: ",
                                             std::string(remove_ws.status().message())));
  }
  ugm->remove_extra_whitespaces = *remove_ws;
  if (const GgufValue* v = gguf.Find(tokenizer_internal::kCharsmapKey); v != nullptr) {
    if (v->type != GgufValueType::kArray ||
        (v->elem_type != GgufValueType::kUint8 && v->elem_type != GgufValueType::kInt8)) {
      return absl::InvalidArgumentError(
          StrCat(tokenizer_internal::kCharsmapKey, ": expected an array of uint8 or int8, got ",
                 GgufValueTypeName(v->type),
                 v->type == GgufValueType::kArray ? StrCat(" of ", GgufValueTypeName(v->elem_type))
                                                  : std::string()));
    }
    // An empty map is no map, as llama.cpp treats it.
    if (v->count > 0) {
      PD_ASSIGN_OR_RETURN(ugm->charsmap,
                          PrecompiledCharsmap::Parse(absl::MakeConstSpan(v->raw, v->count)));
    }
  }
  float min_score = FLT_MAX;
  for (int32_t id = 0; id < n_vocab(); ++id) {
    const Token& t = tokens_[id];
    if (t.attrs & TokenAttr::kNormal) min_score = std::min(min_score, t.score);
    if (t.attrs & (TokenAttr::kNormal | TokenAttr::kUserDefined | TokenAttr::kUnused)) {
      ugm->matcher.Insert(t.text, id);
    }
  }
  ugm->unknown_score = min_score - kUnknownPenalty;
  static constexpr char kHex[] = "0123456789ABCDEF";
  for (int b = 0; b < 256; ++b) {
    const std::string name = {'<', '0', 'x', kHex[b >> 4], kHex[b & 15], '>'};
    const int32_t id = Find(name);
    byte_token_[b] = id != kNoToken && (tokens_[id].attrs & TokenAttr::kByte) ? id : kNoToken;
    ugm->byte_fallback |= byte_token_[b] != kNoToken;
  }
  ugm_ = std::move(ugm);
  return absl::OkStatus();
}

void Tokenizer::EncodeUgm(std::string_view text, std::vector<int32_t>* out) const {
  const tokenizer_internal::UgmModel& ugm = *ugm_;

  // ---- 1. normalization ----
  std::string norm;
  norm.reserve(text.size() * 3 / 2 + 4);
  const bool merge_spaces = ugm.remove_extra_whitespaces;
  bool prefixed = false, in_word = false;
  for (size_t off = 0; off < text.size();) {
    std::string_view piece;
    size_t consumed = ugm.charsmap ? ugm.charsmap->Match(text.substr(off), &piece) : 0;
    if (consumed == 0) {
      consumed = LenientSeqLen(text.substr(off));
      if (consumed > 0) {
        piece = text.substr(off, consumed);
      } else {
        piece = kReplacement;
        consumed = 1;
      }
    }
    for (const char c : piece) {
      if (c == ' ') {
        in_word = false;
        if (!merge_spaces) norm += kSpaceEscape;
        continue;
      }
      if (!in_word) {
        in_word = true;
        if ((add_space_prefix_ && !prefixed) || merge_spaces) {
          norm += kSpaceEscape;
          prefixed = true;
        }
      }
      norm.push_back(c);
    }
    off += consumed;
  }
  if (norm.empty()) return;
  PD_CHECK(norm.size() < UINT32_MAX);

  // ---- 2. Viterbi: best[i] is the best segmentation of norm[0, i) ----
  struct Best {
    double score;
    int32_t token;
    uint32_t begin;  // where the last token starts
  };
  const size_t n = norm.size();
  std::vector<Best> best(n + 1, Best{-DBL_MAX, unk_, 0});
  best[0] = {0.0, unk_, 0};
  for (size_t begin = 0; begin < n;) {
    const size_t char_len = std::min(
        tokenizer_internal::Utf8SeqLenByLead(static_cast<uint8_t>(norm[begin])), n - begin);
    const double base = best[begin].score;
    bool whole_char = false;
    int32_t node = 0;
    for (size_t end = begin; end < n;) {
      node = ugm.matcher.Child(node, static_cast<uint8_t>(norm[end]));
      if (node < 0) break;
      ++end;
      const int32_t id = ugm.matcher.Value(node);
      if (id < 0) continue;
      if (end - begin == char_len) whole_char = true;
      const Token& t = tokens_[id];
      const double score =
          base + ((t.attrs & TokenAttr::kUserDefined) ? 0.0 : static_cast<double>(t.score));
      if (score > best[end].score) best[end] = {score, id, static_cast<uint32_t>(begin)};
    }
    if (!whole_char) {
      const double score = base + ugm.unknown_score;
      Best& slot = best[begin + char_len];
      if (score > slot.score) slot = {score, unk_, static_cast<uint32_t>(begin)};
    }
    begin += char_len;
  }

  // ---- 3. backtrack, joining adjacent unknown tokens ----
  struct Piece {
    int32_t token;
    uint32_t begin, end;
  };
  std::vector<Piece> pieces;
  for (size_t end = n; end > 0;) {
    const Best& b = best[end];
    if (b.token == unk_ && !pieces.empty() && pieces.back().token == unk_) {
      pieces.back().begin = b.begin;
    } else {
      pieces.push_back({b.token, b.begin, static_cast<uint32_t>(end)});
    }
    end = b.begin;
  }
  for (auto it = pieces.rbegin(); it != pieces.rend(); ++it) {
    if (it->token != unk_ || !ugm.byte_fallback) {
      out->push_back(it->token);
      continue;
    }
    // Byte fallback: every byte needs its token, or the run stays one unknown token (as in
    // Hugging Face's Unigram).
    const std::string_view run = std::string_view(norm).substr(it->begin, it->end - it->begin);
    bool all = true;
    for (const char ch : run) all &= byte_token_[static_cast<uint8_t>(ch)] != kNoToken;
    if (!all) {
      out->push_back(unk_);
      continue;
    }
    for (const char ch : run) out->push_back(byte_token_[static_cast<uint8_t>(ch)]);
  }
}

}  // namespace pd::engine
