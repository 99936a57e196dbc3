// BPE: byte-level (tokenizer.ggml.model = gpt2), or over raw UTF-8 (gemma4 and the other
// SentencePiece-style types, PreTokenizerSpec::byte_encode false).
//
// Encode path per run of text: lenient UTF-8 decode (llama.cpp's rules, see tokenizer.h) ->
// regex pre-tokenizer -> each piece's bytes mapped onto the GPT-2 alphabet -> rank-ordered merges.
// The merges use a linked list of symbols and a min-heap of candidate pairs keyed by (rank, left
// position); a pair whose symbols changed since it was queued is recognised by its total length and
// skipped. Each merge costs O(log n), a piece of n symbols O(n log n).
#include <algorithm>
#include <string>
#include <vector>

#include "common/status.h"
#include "engine/tokenizer/pretokenizer.h"
#include "engine/tokenizer/tokenizer.h"
#include "engine/tokenizer/unicode.h"

namespace pd::engine {

struct Tokenizer::BpeScratch {
  struct Symbol {
    int32_t prev, next;
    uint32_t begin;  // byte offset in the word
    uint32_t len;    // 0 once merged into its left neighbour
  };
  struct Candidate {
    int32_t rank;  // of the merge
    int32_t left, right;
    uint32_t len;  // bytes of left + right when queued; a mismatch later means "stale"
  };
  std::vector<Symbol> syms;
  std::vector<Candidate> heap;  // a min-heap by (rank, left), see `order` below
  std::string key;              // "left right" lookup key
  std::string word;             // the piece in the byte-level alphabet
};

namespace {

using tokenizer_internal::AppendUtf8;
using tokenizer_internal::kReplacementChar;

}  // namespace

void Tokenizer::EncodeBpe(std::string_view text, std::vector<int32_t>* out) const {
  // Normalise to the code points llama.cpp sees. `regex_text` differs from `normalized` only where
  // a surrogate code point (which PCRE2 cannot take) is replaced by U+E000, a private-use
  // character of the same byte length that every pattern classifies the same way (neither letter,
  // number, punctuation nor space), so byte offsets carry over.
  std::string normalized;
  normalized.reserve(text.size() + 8);
  bool has_surrogate = false;
  for (uint32_t cpt : tokenizer_internal::DecodeUtf8Lenient(text)) {
    if (cpt > 0x10FFFF) cpt = kReplacementChar;  // llama.cpp aborts here
    has_surrogate |= cpt >= 0xD800 && cpt <= 0xDFFF;
    if (cpt == ' ' && escape_spaces_) cpt = 0x2581;  // SentencePiece's "▁"
    AppendUtf8(cpt, &normalized);
  }
  std::string regex_text;
  if (has_surrogate) {
    regex_text.reserve(normalized.size());
    for (uint32_t cpt : tokenizer_internal::DecodeUtf8Lenient(normalized)) {
      AppendUtf8(cpt >= 0xD800 && cpt <= 0xDFFF ? 0xE000 : cpt, &regex_text);
    }
  }
  std::vector<std::pair<size_t, size_t>> pieces;
  pre_tokenizer_->Split(has_surrogate ? regex_text : normalized, &pieces);

  BpeScratch scratch;
  for (const auto& [begin, end] : pieces) {
    const std::string_view piece = std::string_view(normalized).substr(begin, end - begin);
    if (whole_newline_runs_ && piece.find_first_not_of('\n') == std::string_view::npos) {
      const int32_t id = Find(piece);
      if (id != kNoToken) {
        out->push_back(id);
        continue;
      }
    }
    if (!byte_encode_) {
      MergeBpeWord(piece, &scratch, out);
      continue;
    }
    scratch.word.clear();
    for (const char c : piece) {
      scratch.word += tokenizer_internal::ByteToUnicodeUtf8(static_cast<uint8_t>(c));
    }
    MergeBpeWord(scratch.word, &scratch, out);
  }
}

void Tokenizer::MergeBpeWord(std::string_view word, BpeScratch* scratch,
                             std::vector<int32_t>* out) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    const int32_t id = Find(word);
    if (id != kNoToken) {
      out->push_back(id);
      return;
    }
  }
  PD_CHECK(word.size() < UINT32_MAX);  // symbol offsets are 32-bit
  using Candidate = BpeScratch::Candidate;
  std::vector<BpeScratch::Symbol>& syms = scratch->syms;
  std::vector<Candidate>& heap = scratch->heap;
  std::string& key = scratch->key;
  syms.clear();
  heap.clear();
  for (size_t off = 0; off < word.size();) {
    const size_t len = std::min(tokenizer_internal::Utf8SeqLenByLead(word[off]), word.size() - off);
    const int32_t index = static_cast<int32_t>(syms.size());
    syms.push_back({index - 1, off + len == word.size() ? -1 : index + 1,
                    static_cast<uint32_t>(off), static_cast<uint32_t>(len)});
    off += len;
  }

  // Heap order: lowest rank first; on ties the leftmost pair.
  const auto order = [](const Candidate& a, const Candidate& b) {
    return a.rank > b.rank || (a.rank == b.rank && a.left > b.left);
  };
  auto candidate = [&](int32_t left, int32_t right, Candidate* c) {
    if (left < 0 || right < 0) return false;
    const auto& l = syms[left];
    const auto& r = syms[right];
    key.assign(word.substr(l.begin, l.len));
    key.push_back(' ');
    key.append(word.substr(r.begin, r.len));
    const auto it = merge_rank_.find(key);
    if (it == merge_rank_.end()) return false;
    *c = {it->second, left, right, l.len + r.len};
    return true;
  };
  Candidate c;
  for (int32_t i = 1; i < static_cast<int32_t>(syms.size()); ++i) {
    if (candidate(i - 1, i, &c)) heap.push_back(c);
  }
  std::make_heap(heap.begin(), heap.end(), order);
  auto push = [&](int32_t left, int32_t right) {
    if (candidate(left, right, &c)) {
      heap.push_back(c);
      std::push_heap(heap.begin(), heap.end(), order);
    }
  };

  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), order);
    const Candidate top = heap.back();
    heap.pop_back();
    auto& left = syms[top.left];
    auto& right = syms[top.right];
    if (left.len == 0 || right.len == 0 || left.len + right.len != top.len) continue;  // stale
    left.len += right.len;
    right.len = 0;
    left.next = right.next;
    if (right.next >= 0) syms[right.next].prev = top.left;
    push(left.prev, top.left);
    push(top.left, left.next);
  }

  for (int32_t i = 0; i != -1; i = syms[i].next) {
    const std::string_view s = word.substr(syms[i].begin, syms[i].len);
    const int32_t id = Find(s);
    if (id != kNoToken) {
      out->push_back(id);
      continue;
    }
    // Not a token (a merge whose result is missing from the vocabulary, or a byte symbol the
    // vocabulary lacks): fall back to single-byte tokens where they exist, as llama.cpp does:
    // one character of the byte alphabet, or <0xXX> for BPE over raw UTF-8.
    for (const char ch : s) {
      int32_t b;
      if (byte_encode_) {
        b = Find(std::string_view(&ch, 1));
      } else {
        static constexpr char kHex[] = "0123456789ABCDEF";
        const uint8_t u = static_cast<uint8_t>(ch);
        const char name[6] = {'<', '0', 'x', kHex[u >> 4], kHex[u & 15], '>'};
        b = Find(std::string_view(name, 6));
      }
      if (b != kNoToken) out->push_back(b);
    }
  }
}

}  // namespace pd::engine
