// A byte trie over token texts, for the tokenizers that match tokens by their text (Unigram's
// Viterbi search, ugm.cc; WordPiece's longest match, wpm.cc). Internal to engine/tokenizer.
//
// Thread safety: Insert() while building only; the const methods may then be called concurrently.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"

namespace pd::engine::tokenizer_internal {

// Node 0 is the root; Child() walks one byte.
class TokenTrie {
 public:
  TokenTrie() : values_(1, -1) {}

  // Makes `text` end at a node holding `id`. A text inserted twice keeps the later id (callers
  // insert unique texts: the loader refuses duplicate tokens).
  void Insert(std::string_view text, int32_t id) {
    int32_t node = 0;
    for (const char ch : text) {
      const uint64_t key = (static_cast<uint64_t>(node) << 8) | static_cast<uint8_t>(ch);
      const auto [it, inserted] = children_.emplace(key, static_cast<int32_t>(values_.size()));
      if (inserted) values_.push_back(-1);
      node = it->second;
    }
    values_[node] = id;
  }

  // The child of `node` by `byte`, -1 when there is none.
  int32_t Child(int32_t node, uint8_t byte) const {
    const auto it = children_.find((static_cast<uint64_t>(node) << 8) | byte);
    return it == children_.end() ? -1 : it->second;
  }
  // The token id that ends at `node`, -1 when none does.
  int32_t Value(int32_t node) const { return values_[node]; }

 private:
  absl::flat_hash_map<uint64_t, int32_t> children_;  // (node << 8 | byte) -> node
  std::vector<int32_t> values_;                      // by node
};

}  // namespace pd::engine::tokenizer_internal
