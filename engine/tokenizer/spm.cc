// SentencePiece-style BPE (tokenizer.ggml.model = llama): greedy merging of adjacent symbols by
// the score of the token they form, with byte-token fallback.
//
// The text is cut into initial symbols by the high nibble of each lead byte (no validation), so
// invalid UTF-8 simply yields symbols that are not tokens and fall back to bytes, as in llama.cpp.
// Symbols form a doubly linked list over the text; a max-heap holds candidate pairs. A pair whose
// symbols changed since it was queued is recognised by its total length and skipped, so each merge
// costs O(log n) and a run of n symbols O(n log n). When the vocabulary allows it, the text is
// first cut into independent runs at spaces (see EncodeSpm), which keeps the heaps small.
#include <algorithm>
#include <vector>

#include "common/status.h"
#include "engine/tokenizer/tokenizer.h"
#include "engine/tokenizer/unicode.h"

namespace pd::engine {

struct Tokenizer::SpmScratch {
  struct Symbol {
    int32_t prev, next;
    uint32_t begin;  // byte offset in the run
    uint32_t len;    // 0 once merged into its left neighbour
  };
  struct Candidate {
    float score;  // of the token the pair forms
    int32_t left, right;
    uint32_t len;  // bytes of left + right when queued; a mismatch later means "stale"
  };
  std::vector<Symbol> syms;
  std::vector<Candidate> heap;  // a max-heap, see `order` below
};

namespace {

constexpr std::string_view kSpmSpace = "\xE2\x96\x81";

}  // namespace

// One independent run of symbols.
void Tokenizer::EncodeSpmRun(std::string_view text, SpmScratch* scratch,
                             std::vector<int32_t>* out) const {
  PD_CHECK(text.size() < UINT32_MAX);  // symbol offsets are 32-bit
  using SpmCandidate = SpmScratch::Candidate;
  std::vector<SpmScratch::Symbol>& syms = scratch->syms;
  std::vector<SpmCandidate>& heap = scratch->heap;
  syms.clear();
  heap.clear();
  for (size_t off = 0; off < text.size();) {
    const size_t len = std::min(tokenizer_internal::Utf8SeqLenByLead(text[off]), text.size() - off);
    const int32_t index = static_cast<int32_t>(syms.size());
    syms.push_back({index - 1, off + len == text.size() ? -1 : index + 1,
                    static_cast<uint32_t>(off), static_cast<uint32_t>(len)});
    off += len;
  }

  // Max-heap order: highest score first; on ties the leftmost pair.
  const auto order = [](const SpmCandidate& a, const SpmCandidate& b) {
    return a.score < b.score || (a.score == b.score && a.left > b.left);
  };
  auto candidate = [&](int32_t left, int32_t right, SpmCandidate* c) {
    if (left < 0 || right < 0) return false;
    const uint32_t len = syms[left].len + syms[right].len;
    const int32_t id = Find(text.substr(syms[left].begin, len));
    if (id == kNoToken) return false;
    *c = {tokens_[id].score, left, right, len};
    return true;
  };
  SpmCandidate c;
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
    const SpmCandidate top = heap.back();
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

  // Every merged symbol is a token by construction; an unmerged one that is not a token (a
  // character outside the vocabulary, or invalid UTF-8) becomes byte tokens.
  for (int32_t i = 0; i != -1; i = syms[i].next) {
    const std::string_view s = text.substr(syms[i].begin, syms[i].len);
    const int32_t id = Find(s);
    if (id != kNoToken) {
      out->push_back(id);
      continue;
    }
    for (const char ch : s) {
      // A vocabulary without the byte token: llama.cpp aborts; we emit UNK if there is one.
      const int32_t b = byte_token_[static_cast<uint8_t>(ch)];
      if (b != kNoToken) {
        out->push_back(b);
      } else if (unk_ != kNoToken) {
        out->push_back(unk_);
      }
    }
  }
}

void Tokenizer::EncodeSpm(std::string_view text, std::vector<int32_t>* out) const {
  if (text.empty()) return;
  SpmScratch scratch;
  if (!spm_split_at_spaces_) {
    EncodeSpmRun(text, &scratch, out);
    return;
  }
  // No token holds a U+2581 after anything but U+2581 (checked at load), so no merge can join a
  // symbol to a following U+2581 symbol unless that symbol is U+2581 too: the text splits into
  // independent runs there. Same result as one run, with far smaller heaps. Cuts are made only at
  // boundaries of the initial symbol split, which invalid bytes can shift.
  size_t run_start = 0;
  bool prev_is_space = false;
  for (size_t off = 0; off < text.size();) {
    const size_t len = std::min(tokenizer_internal::Utf8SeqLenByLead(text[off]), text.size() - off);
    const bool is_space = text.substr(off, len) == kSpmSpace;
    if (is_space && off > run_start && !prev_is_space) {
      EncodeSpmRun(text.substr(run_start, off - run_start), &scratch, out);
      run_start = off;
    }
    prev_is_space = is_space;
    off += len;
  }
  EncodeSpmRun(text.substr(run_start), &scratch, out);
}

}  // namespace pd::engine
